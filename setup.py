"""Builds pyconcbench._native from the C sources in native/.

Environment:
  PCB_DEBUG=1     -O0 -g with AddressSanitizer and UBSan (load with LD_PRELOAD of libasan,
                  see README "Debug build").
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


def _flags():
    if os.environ.get("PCB_DEBUG", "") not in ("", "0"):
        san = ["-fsanitize=address,undefined", "-fno-omit-frame-pointer"]
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


compile_args, link_args = _flags()
setup(
    ext_modules=[
        Extension(
            "pyconcbench._native",
            sources=SOURCES,
            depends=sorted(glob.glob("native/*.h")),
            include_dirs=["native"],
            extra_compile_args=compile_args,
            extra_link_args=link_args + ["-lpthread"],
        )
    ],
    cmdclass={"build_ext": checked_build_ext},
)
