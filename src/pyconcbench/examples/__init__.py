"""Examples shipped with the package: ``echo_server`` is the README's server of one's own
(``pyconcbench run --pcb-impl pyconcbench.examples.echo_server:serve``)."""
