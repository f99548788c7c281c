#!/bin/sh
# preview-dns.sh makes this machine's resolver answer *.localhost with
# loopback, as browsers do by themselves, so that python3 and node (which
# ask glibc) reach preview URLs such as http://pv-ID.localhost:8080/.
# glibc does not resolve *.localhost; systemd's NSS module myhostname does.
# Run as root; it is idempotent, and does nothing where names resolve
# already.
set -eu

name=pv-check.localhost
if getent hosts "$name" >/dev/null 2>&1; then
	exit 0
fi
if [ "$(id -u)" != 0 ]; then
	echo "preview-dns.sh: $name does not resolve; run as root to install libnss-myhostname" >&2
	exit 1
fi
if ! dpkg-query -W -f '${Status}' libnss-myhostname 2>/dev/null | grep -q 'install ok installed'; then
	# A machine whose package lists were never fetched knows no package:
	# fetch them, once, when the install fails.
	install() { DEBIAN_FRONTEND=noninteractive apt-get install -y -q libnss-myhostname >/dev/null; }
	install || { apt-get -q update >/dev/null && install; }
fi
# The package's own script adds myhostname to the hosts line; a line it
# left alone gets it before dns.
if ! grep -Eq '^hosts:.*[[:space:]]myhostname([[:space:]]|$)' /etc/nsswitch.conf; then
	sed -i -E 's/^(hosts:[[:space:]]*files)/\1 myhostname/' /etc/nsswitch.conf
fi
getent hosts "$name" >/dev/null || {
	echo "preview-dns.sh: $name still does not resolve; check the hosts line of /etc/nsswitch.conf" >&2
	exit 1
}
