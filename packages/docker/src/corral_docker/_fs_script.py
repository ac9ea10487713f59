"""The POSIX ``sh`` program behind ContainerFileSystem.

Run as ``sh -c FS_SCRIPT corral-fs OP REL [ARGS...]`` with REL the path
relative to ``/workspace`` (no ``..``: the host normalised it). It only
needs ``sh``, ``stat``, ``find``, ``cat``, ``mv``, ``mkdir``, ``rm``,
``rmdir``, ``chmod``, ``ls`` and ``tar`` (busybox or coreutils). Exit codes
10-18 map to corral error codes in ``_remote_fs._CODES``.
"""

from __future__ import annotations

from typing import Final

__all__ = ["FS_SCRIPT"]

FS_SCRIPT: Final = r"""
W=/workspace
parents() {
  d=$W
  case $1 in */*) rest=${1%/*} ;; *) return 0 ;; esac
  oldifs=$IFS; IFS=/; set -f
  for c in $rest; do
    d=$d/$c
    if [ -L "$d" ]; then exit 18; fi
    if [ -d "$d" ]; then continue; fi
    if [ -e "$d" ]; then exit 13; fi
    if [ "$2" = 1 ]; then
      mkdir -- "$d" 2>/dev/null || [ -d "$d" ] || exit 17
    else
      exit 10
    fi
  done
  IFS=$oldifs; set +f
}
LISTER='stat -c "%f %s %Y" -- "$@"; printf "\001"; printf "%s\000" "$@"; printf "\002"'
op=$1; rel=$2; shift 2
P=$W${rel:+/$rel}
case $op in
read)
  parents "$rel" 0
  [ -L "$P" ] && exit 18
  [ -d "$P" ] && exit 12
  [ -e "$P" ] || exit 10
  [ -f "$P" ] || exit 15
  [ -r "$P" ] || exit 17
  s=$(stat -c %s -- "$P") || exit 17
  [ "$s" -gt "$1" ] && exit 16
  exec cat -- "$P" ;;
prepw)
  parents "$rel" 1
  [ -L "$P" ] && exit 18
  [ -d "$P" ] && exit 12
  [ -w "${P%/*}" ] || exit 17
  exit 0 ;;
commit)
  t=${P%/*}/$1
  ( parents "$rel" 0 ) || { c=$?; rm -f -- "$t"; exit "$c"; }
  if [ -L "$P" ]; then rm -f -- "$t"; exit 18; fi
  if [ -d "$P" ]; then rm -f -- "$t"; exit 12; fi
  if [ -f "$P" ]; then m=$(stat -c %a -- "$P") && chmod "$m" -- "$t"; fi
  mv -f -- "$t" "$P" 2>/dev/null || { rm -f -- "$t"; exit 17; }
  exit 0 ;;
stat)
  parents "$rel" 0
  [ -e "$P" ] || [ -L "$P" ] || exit 10
  exec stat -c '%f %s %Y' -- "$P" ;;
list|walk)
  parents "$rel" 0
  [ -L "$P" ] && exit 13
  [ -e "$P" ] || exit 10
  [ -d "$P" ] || exit 13
  cd -- "$P" || exit 17
  if [ "$op" = list ]; then
    find . -mindepth 1 -maxdepth 1 -exec sh -c "$LISTER" sh {} +
  else
    find . -mindepth 1 -exec sh -c "$LISTER" sh {} +
  fi
  exit 0 ;;
mkdir)
  parents "$rel" "$1"
  if [ -d "$P" ] && [ ! -L "$P" ]; then [ "$1" = 1 ] && exit 0; exit 11; fi
  if [ -e "$P" ] || [ -L "$P" ]; then exit 11; fi
  mkdir -- "$P" 2>/dev/null && exit 0
  [ -d "$P" ] && { [ "$1" = 1 ] && exit 0; exit 11; }
  exit 17 ;;
rm)
  parents "$rel" 0
  [ -e "$P" ] || [ -L "$P" ] || exit 10
  if [ -d "$P" ] && [ ! -L "$P" ]; then
    if [ "$1" = 1 ]; then rm -rf -- "$P" 2>/dev/null || exit 17; exit 0; fi
    rmdir -- "$P" 2>/dev/null && exit 0
    [ -n "$(ls -A -- "$P")" ] && exit 14
    exit 17
  fi
  rm -f -- "$P" 2>/dev/null || exit 17
  exit 0 ;;
tar)
  cd "$W" || exit 17
  exec tar -cf - --no-recursion -- "$@" 2>/dev/null ;;
*)
  exit 2 ;;
esac
"""
