"""pyconcbench: what each Python concurrency model costs, measured on real sockets."""

__version__ = "0.1.0"
