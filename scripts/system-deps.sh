#!/usr/bin/env bash
# Installs the Debian packages the build and the tests need, only those that are missing.
# Non-interactive: CI runs it as root with no terminal.
set -euo pipefail

need=()
python3 -c 'import venv, ensurepip' 2>/dev/null || need+=(python3-venv)
[ -e "$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["include"])')/Python.h" ] || need+=(python3-dev)
command -v gcc >/dev/null || need+=(gcc)
command -v make >/dev/null || need+=(make)
# The native codec links the batch compression libraries (docs/FORMAT.md#compression).
dpkg -s libzstd-dev >/dev/null 2>&1 || need+=(libzstd-dev)
dpkg -s liblz4-dev >/dev/null 2>&1 || need+=(liblz4-dev)
# The contract tests start their own etcd (free loopback ports, temporary data dir); Debian's etcd-server puts
# it at /usr/bin/etcd. The package's own service is not used by anything here.
command -v etcd >/dev/null || need+=(etcd-server)
# PySpark (the spark/ data source and its tests) runs Spark on a JVM: Java 17.
dpkg -s openjdk-17-jre-headless >/dev/null 2>&1 || need+=(openjdk-17-jre-headless)
# The fault tests fill real small file systems: a tmpfs (mount, util-linux) and an ext4 image on a loop
# device (mkfs.ext4, e2fsprogs), which takes the WAL's O_DIRECT appends.
command -v mount >/dev/null || need+=(mount)
command -v mkfs.ext4 >/dev/null || need+=(e2fsprogs)
# Benchmark servers get SIGKILL when their parent dies through setpriv --pdeathsig (util-linux).
command -v setpriv >/dev/null || need+=(util-linux)
# The clock-jump test moves a broker's wall clock with libfaketime (LD_PRELOAD).
dpkg -s faketime >/dev/null 2>&1 || need+=(faketime)
# The web console's tests drive a real headless Chromium through its WebDriver (tests/console).
command -v chromium >/dev/null || need+=(chromium)
command -v chromedriver >/dev/null || need+=(chromium-driver)

if [ ${#need[@]} -gt 0 ]; then
    sudo=""
    [ "$(id -u)" -eq 0 ] || sudo="sudo"
    echo "installing Debian packages: ${need[*]}"
    DEBIAN_FRONTEND=noninteractive $sudo apt-get update -q
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q "${need[@]}"
fi
