#!/usr/bin/env bash
# Installs rlwatch from this checkout into a virtualenv, .venv (stock Debian's python3 refuses
# `pip install` outside one: "externally-managed-environment").
#
#   scripts/install.sh              # the command line, the worker, the dashboard and the SDK
#   scripts/install.sh all          # ... and what the tests need
#   . .venv/bin/activate            # puts `rlwatch` on your PATH in this shell
#
# RLWATCH_VENV=DIR installs into DIR instead of .venv; PYTHON=python3.12 picks the interpreter.
# With a Python you manage yourself (pyenv, conda: not "externally managed"), the virtualenv also
# sees the packages already installed for it, so nothing is downloaded twice;
# RLWATCH_VENV_ISOLATED=1 makes it a plain, isolated one (as with Debian's python3).
# Idempotent: a second call with nothing changed returns at once.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv="${RLWATCH_VENV:-$root/.venv}"
extras="${1:-sdk,worker,web}"
py="${PYTHON:-python3}"

die() { echo "install.sh: $*" >&2; exit 1; }

command -v "$py" >/dev/null 2>&1 || die "$py not found: install Python 3.10 or newer (Debian: apt-get install python3 python3-venv)"
"$py" -c 'import sys; sys.exit(sys.version_info < (3, 10))' \
  || die "rlwatch needs Python 3.10 or newer; $py is $("$py" -c 'import platform; print(platform.python_version())')"

venv_args=()
managed="$("$py" -c 'import os, sysconfig; print(int(os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED"))))')"
if [ "$managed" = 0 ] && [ -z "${RLWATCH_VENV_ISOLATED:-}" ]; then
  venv_args=(--system-site-packages)
fi
if [ ! -x "$venv/bin/python" ]; then
  echo "install.sh: creating the virtualenv $venv ..."
  if ! out="$("$py" -m venv "${venv_args[@]}" "$venv" 2>&1)"; then
    case "$out" in
      *ensurepip*) ;;   # Debian ships venv's pip bootstrap in a separate package: install it below
      *) die "'$py -m venv $venv' failed: $out" ;;
    esac
    rm -rf "$venv"
    pkg="python3-venv"
    ver="$("$py" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')"
    command -v apt-get >/dev/null 2>&1 || die "'$py -m venv' needs the venv module's pip bootstrap (ensurepip): install it for your Python"
    SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
    echo "install.sh: '$py -m venv' needs Debian's $pkg (python$ver-venv); installing it ..."
    $SUDO apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$pkg" "python$ver-venv" >/dev/null \
      || DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "$pkg" >/dev/null \
      || die "could not install $pkg: apt-get install $pkg, then run this again"
    "$py" -m venv "${venv_args[@]}" "$venv" || die "'$py -m venv $venv' failed"
  fi
fi

# The native signal bank (native/, Rust) is built by pip when cargo is there; rustup installs
# cargo in ~/.cargo/bin, which a fresh shell may not have on its PATH yet.
if ! command -v cargo >/dev/null 2>&1 && [ -x "$HOME/.cargo/bin/cargo" ]; then
  PATH="$HOME/.cargo/bin:$PATH"
fi
native_built() { "$venv/bin/python" -c 'import streams._native' >/dev/null 2>&1; }

# skip the install when this checkout is installed with these extras, pyproject.toml and the
# native core's sources are unchanged (and the native core is built, or still cannot be: no cargo)
stamp="$venv/.rlwatch-install"
want="$root $(cat "$root/pyproject.toml" "$root"/native/Cargo.* "$root"/native/src/*.rs 2>/dev/null | sha256sum | cut -c1-16)"
if [ -f "$stamp" ] && [ -x "$venv/bin/rlwatch" ] \
   && { native_built || ! command -v cargo >/dev/null 2>&1; }; then
  read -r have_root have_hash have_extras < "$stamp" || true
  if [ "$have_root $have_hash" = "$want" ]; then
    covered=1
    for e in ${extras//,/ }; do
      case ",$have_extras," in *",$e,"*|*",all,"*) ;; *) covered=0 ;; esac
    done
    if [ "$covered" = 1 ]; then
      echo "install.sh: rlwatch is installed in $venv (extras $have_extras)"
      exit 0
    fi
    extras="$have_extras,$extras"
  fi
fi

echo "install.sh: installing rlwatch[$extras] into $venv (a minute or two the first time) ..."
# unlink the built native core first: the build writes a new file instead of overwriting the
# one that running workers and benchmarks of this checkout have mapped (that crashes them)
rm -f "$root"/streams/_native*.so
"$venv/bin/python" -m pip install -q --disable-pip-version-check -e "$root[$extras]" \
  || die "pip could not install rlwatch[$extras] (see above)"
ver="$("$venv/bin/rlwatch" --version 2>&1)" || die "the installed rlwatch does not start: $ver"
if ! native_built; then
  if command -v cargo >/dev/null 2>&1; then
    why="cargo is there but the build failed (see pip's output above)"
  else
    why="no Rust toolchain: install it (https://rustup.rs) and run this again"
  fi
  echo "install.sh: NOTE: the native core (streams._native) was not built ($why);" \
       "rlwatch works, with the pure Python signal bank, about 2 times slower"
fi
echo "$want $extras" > "$stamp"
echo "install.sh: done: $ver in $venv; '. $venv/bin/activate' puts rlwatch on your PATH"
