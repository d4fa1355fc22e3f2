#!/bin/sh
host=$1; shift
exec ip netns exec "$host" unshare --uts /bin/sh -c 'hostname "$0" && eval "$1"' "$host" "$*"
