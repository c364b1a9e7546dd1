#!/bin/sh
# The Debian packages some tests drive, installed by `make test` when missing: Chromium (the
# dashboard in a real browser) and Prometheus with promtool (the Grafana dashboard's queries and
# the alerting rules on a real Prometheus). Needs root or password-less sudo; otherwise it says
# what to install, and those tests fail under `make test` (skip under plain pytest).
set -e
missing=""
command -v chromium >/dev/null 2>&1 || missing="$missing chromium"
if ! command -v prometheus >/dev/null 2>&1 || ! command -v promtool >/dev/null 2>&1; then
	missing="$missing prometheus"
fi
[ -z "$missing" ] && exit 0
if [ "$(id -u)" = 0 ]; then
	sudo=""
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
	sudo="sudo -n"
else
	echo "install_test_tools: not root: run 'sudo apt-get install$missing' for the tests that need them" >&2
	exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
	echo "install_test_tools: no apt-get here: install$missing yourself" >&2
	exit 0
fi
echo "install_test_tools: apt-get install$missing"
export DEBIAN_FRONTEND=noninteractive
# shellcheck disable=SC2086
$sudo apt-get install -y -q --no-install-recommends $missing >/dev/null 2>&1 || {
	$sudo apt-get update -q >/dev/null
	$sudo apt-get install -y -q --no-install-recommends $missing >/dev/null
}
