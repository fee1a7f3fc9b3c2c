"""Builds pyconcbench._native from the C sources in native/, and the small helper programs in
native/helpers/ (plain C executables installed in the package beside the extension: see
HELPERS).

Environment:
  PCB_DEBUG=1     -O0 -g with AddressSanitizer and UBSan, float-cast overflow included, every
                  finding fatal (load with LD_PRELOAD of libasan and libubsan; `make test-asan`
                  builds one into build/asan and runs the native tests under it).
  PCB_CFLAGS=...  extra compiler flags, appended last (so they override the defaults).
"""
import glob
import os
import shlex
import shutil
import sys
import sysconfig

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

SOURCES = sorted(
    os.path.join("native", name)
    for name in os.listdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), "native"))
    if name.endswith(".c")
)

#: Executables built from one C file each, installed in the package pyconcbench: programs the
#: measurements run as processes of their own (pcb_forkloop: fork timed from a tiny process,
#: as the context-switch study did).  Built with plain -O2 (never the sanitizers of a debug
#: build: they would inflate the very process size being measured), libc only.
HELPERS = [("pcb_forkloop", os.path.join("native", "helpers", "pcb_forkloop.c"))]
HELPER_ARGS = ["-O2", "-Wall", "-Wextra", "-std=gnu11"]


def _flags():
    if os.environ.get("PCB_DEBUG", "") not in ("", "0"):
        san = ["-fsanitize=address,undefined", "-fsanitize=float-cast-overflow",
               "-fno-sanitize-recover=all", "-fno-omit-frame-pointer"]
        compile_args = ["-O0", "-g", "-Wall", "-Wextra"] + san
        link_args = san
    else:
        compile_args = ["-O2", "-Wall", "-Wextra"]
        link_args = []
    compile_args += ["-std=gnu11", "-Wno-unused-parameter", "-Wno-missing-field-initializers"]
    compile_args += shlex.split(os.environ.get("PCB_CFLAGS", ""))
    return compile_args, link_args


class checked_build_ext(build_ext):
    """Fails early, with one actionable line, when the compiler or Python.h is missing."""

    def run(self):
        if not sys.platform.startswith("linux"):
            sys.exit("error: pyconcbench's native engine needs Linux (epoll); this is %s" % sys.platform)
        include = sysconfig.get_paths()["include"]
        if not os.path.exists(os.path.join(include, "Python.h")):
            sys.exit(
                "error: Python headers not found (%s/Python.h): install python3-dev "
                "(Debian/Ubuntu) or python3-devel (Fedora) for this interpreter" % include
            )
        cc = shlex.split(os.environ.get("CC") or sysconfig.get_config_var("CC") or "cc")[0]
        if shutil.which(cc) is None:
            sys.exit(
                "error: C compiler %r not found: install gcc (apt-get install build-essential) "
                "or set CC" % cc
            )
        super().run()
        self.build_helpers()

    def _helper_paths(self, name):
        """(where the build puts it, where an in-place/editable build copies it)."""
        build_py = self.get_finalized_command("build_py")
        return (os.path.join(self.build_lib, "pyconcbench", name),
                os.path.join(build_py.get_package_dir("pyconcbench"), name))

    def build_helpers(self):
        """Compiles and links each helper with the extension's compiler (self.compiler, set up
        by build_ext), then copies it into the source tree for in-place and editable builds."""
        for name, source in HELPERS:
            regular, inplace = self._helper_paths(name)
            objects = self.compiler.compile([source], output_dir=self.build_temp,
                                            extra_postargs=HELPER_ARGS)
            self.compiler.link_executable(objects, name, output_dir=os.path.dirname(regular))
            if self.inplace:
                self.copy_file(regular, inplace, level=self.verbose)

    def get_outputs(self):
        return super().get_outputs() + [self._helper_paths(name)[1 if self.inplace else 0]
                                        for name, _ in HELPERS]

    def get_output_mapping(self):  # setuptools >= 64: the editable install's file map
        mapping = super().get_output_mapping()
        if self.inplace:
            mapping.update(self._helper_paths(name) for name, _ in HELPERS)
        return mapping


compile_args, link_args = _flags()
setup(
    ext_modules=[
        Extension(
            "pyconcbench._native",
            sources=SOURCES,
            depends=sorted(glob.glob("native/*.h")),
            include_dirs=["native"],
            extra_compile_args=compile_args,
            extra_link_args=link_args + ["-lpthread", "-lm"],
        )
    ],
    cmdclass={"build_ext": checked_build_ext},
)
