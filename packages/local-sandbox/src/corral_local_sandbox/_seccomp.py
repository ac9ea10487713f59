"""A classic-BPF seccomp filter, assembled here, that bubblewrap loads with ``--seccomp FD``.

The filter is a denylist in the spirit of Flatpak's: it refuses the
syscalls used to leave a namespace sandbox, to regain privileges, or to
spy on other processes, and lets everything else through (an allowlist
would break arbitrary developer tools). It also refuses set-id *modes*
(``chmod``/``open``/``mknod`` and friends with ``S_ISUID``/``S_ISGID``):
the sandbox uid is the caller's host uid, which may be root. Layout of ``struct seccomp_data``:
``nr`` at 0, ``arch`` at 4, the instruction pointer at 8, ``args[i]`` at
``16 + 8*i`` (64-bit, little-endian on both supported architectures, so
the low 32 bits are at ``16 + 8*i``).
"""

from __future__ import annotations

import errno
import platform
import struct
from collections.abc import Mapping
from typing import Final

import attrs

__all__ = [
    "ARCHES",
    "SeccompArch",
    "build_filter",
    "denied_syscalls",
    "native_arch",
]

# BPF opcodes (linux/filter.h, linux/bpf_common.h).
_LD_W_ABS: Final = 0x20
_JEQ_K: Final = 0x15
_JGE_K: Final = 0x35
_JSET_K: Final = 0x45
_RET_K: Final = 0x06

_RET_KILL_PROCESS: Final = 0x80000000
_RET_ALLOW: Final = 0x7FFF0000
_RET_ERRNO: Final = 0x00050000

_OFF_NR: Final = 0
_OFF_ARCH: Final = 4


def _arg_low(index: int) -> int:
    return 16 + 8 * index


_X32_SYSCALL_BIT: Final = 0x40000000
# CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER | NEWPID | NEWNET; the
# legacy clone() only looks at the low 32 bits of its flags.
_CLONE_NS_MASK: Final = 0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x60000000
_TIOCSTI: Final = 0x5412
_TIOCLINUX: Final = 0x541C
# personality(): PER_LINUX, PER_LINUX32 and the 0xffffffff query stay allowed
# (glibc and setarch use them); everything else, e.g. ADDR_NO_RANDOMIZE, is refused.
_PERSONALITY_OK: Final = (0x0000, 0x0008, 0xFFFFFFFF)


@attrs.frozen
class SeccompArch:
    """Syscall numbers of one architecture.

    Attributes:
        name: ``platform.machine()`` spelling.
        audit_arch: ``AUDIT_ARCH_*`` value checked first by the filter.
        numbers: Syscall name to number.
        x32_bit: The x32 ABI marker to refuse (x86-64 only), or 0.
    """

    name: str
    audit_arch: int
    numbers: Mapping[str, int]
    x32_bit: int = 0


_COMMON_NEW: Final = {
    "openat2": 437,
    "fchmodat2": 452,
    "io_uring_setup": 425,
    "io_uring_enter": 426,
    "io_uring_register": 427,
    "open_tree": 428,
    "move_mount": 429,
    "fsopen": 430,
    "fsconfig": 431,
    "fsmount": 432,
    "fspick": 433,
    "clone3": 435,
    "mount_setattr": 442,
    "open_tree_attr": 467,
}

ARCHES: Final[Mapping[str, SeccompArch]] = {
    "x86_64": SeccompArch(
        "x86_64",
        0xC000003E,
        {
            "ioctl": 16,
            "open": 2,
            "creat": 85,
            "chmod": 90,
            "fchmod": 91,
            "mknod": 133,
            "openat": 257,
            "mknodat": 259,
            "fchmodat": 268,
            "ptrace": 101,
            "personality": 135,
            "pivot_root": 155,
            "chroot": 161,
            "mount": 165,
            "umount2": 166,
            "add_key": 248,
            "request_key": 249,
            "keyctl": 250,
            "clone": 56,
            "unshare": 272,
            "perf_event_open": 298,
            "open_by_handle_at": 304,
            "setns": 308,
            "process_vm_readv": 310,
            "process_vm_writev": 311,
            "bpf": 321,
            "userfaultfd": 323,
            **_COMMON_NEW,
        },
        _X32_SYSCALL_BIT,
    ),
    "aarch64": SeccompArch(
        "aarch64",
        0xC00000B7,
        {
            "ioctl": 29,
            "mknodat": 33,
            "fchmod": 52,
            "fchmodat": 53,
            "openat": 56,
            "umount2": 39,
            "mount": 40,
            "pivot_root": 41,
            "chroot": 51,
            "personality": 92,
            "unshare": 97,
            "ptrace": 117,
            "add_key": 217,
            "request_key": 218,
            "keyctl": 219,
            "clone": 220,
            "perf_event_open": 241,
            "open_by_handle_at": 265,
            "setns": 268,
            "process_vm_readv": 270,
            "process_vm_writev": 271,
            "bpf": 280,
            "userfaultfd": 282,
            **_COMMON_NEW,
        },
    ),
}
"""Supported architectures; the filter kills any process using another ABI."""

# Refused outright with EPERM; the argument-checked ones (clone, ioctl,
# personality) and the ENOSYS ones are handled separately.
_EPERM: Final = (
    "unshare",
    "setns",
    "mount",
    "umount2",
    "chroot",
    "pivot_root",
    "keyctl",
    "add_key",
    "request_key",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "perf_event_open",
    "bpf",
    "userfaultfd",
    "open_by_handle_at",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
)
# ENOSYS makes libcs fall back: glibc retries clone3 as clone (whose flags we
# can inspect, unlike clone3's, which live in user memory); openat2's mode
# lives in a struct too, and callers fall back to openat.
_ENOSYS: Final = (
    "clone3",
    "openat2",
    "open_tree",
    "open_tree_attr",
    "move_mount",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
)


# Set-id bits: the sandbox uid maps to the caller's host uid, which may be
# root, so a set-id mode would leave a root setuid/setgid file on the host.
_SETID: Final = 0o6000
# O_CREAT, and __O_TMPFILE (same value on x86-64 and aarch64): the only opens
# whose mode argument means anything (elsewhere it may be garbage).
_OPEN_CREATES: Final = 0o100 | 0o20000000
# name -> index of the mode argument, for calls that always take a mode.
_MODE_ARG: Final = {
    "chmod": 1,
    "fchmod": 1,
    "fchmodat": 2,
    "fchmodat2": 2,
    "creat": 1,
    "mknod": 1,
    "mknodat": 2,
}
# name -> (index of the flags argument, index of the mode argument).
_OPEN_ARGS: Final = {"open": (1, 2), "openat": (2, 3)}


def denied_syscalls() -> Mapping[str, str]:
    """Every syscall the filter touches and what it does to it, for docs and ``details()``."""
    out = dict.fromkeys(_EPERM, "EPERM")
    out.update(dict.fromkeys(_ENOSYS, "ENOSYS"))
    out["clone"] = "EPERM with namespace flags"
    out["ioctl"] = "EPERM for TIOCSTI, TIOCLINUX"
    out["personality"] = "EPERM except PER_LINUX, PER_LINUX32, query"
    for name in (*_MODE_ARG, *_OPEN_ARGS):
        out[name] = "EPERM with S_ISUID or S_ISGID in the mode"
    return out


def native_arch() -> SeccompArch | None:
    """The architecture of this machine, or None when no filter can be built for it."""
    machine = platform.machine().lower()
    return ARCHES.get({"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine))


def _insn(code: int, k: int, jt: int = 0, jf: int = 0) -> bytes:
    return struct.pack("<HBBI", code, jt, jf, k)


def _ret(value: int) -> bytes:
    return _insn(_RET_K, value)


def _errno(code: int) -> int:
    return _RET_ERRNO | code


def build_filter(arch: SeccompArch) -> bytes:
    """Assemble the filter as packed ``struct sock_filter`` instructions.

    Every comparison is followed immediately by its ``ret``, so jumps are
    one instruction long and cannot overflow the 8-bit offsets.

    Args:
        arch: The architecture whose syscall numbers to use.

    Returns:
        The program, ready to be written to the ``--seccomp`` fd.
    """
    nums = arch.numbers
    prog: list[bytes] = [
        _insn(_LD_W_ABS, _OFF_ARCH),
        _insn(_JEQ_K, arch.audit_arch, jt=1, jf=0),
        _ret(_RET_KILL_PROCESS),
        _insn(_LD_W_ABS, _OFF_NR),
    ]
    if arch.x32_bit:
        prog += [_insn(_JGE_K, arch.x32_bit, jt=0, jf=1), _ret(_RET_KILL_PROCESS)]
    for names, code in ((_EPERM, errno.EPERM), (_ENOSYS, errno.ENOSYS)):
        for name in names:
            prog += [_insn(_JEQ_K, nums[name], jt=0, jf=1), _ret(_errno(code))]

    def guarded(name: str, block: list[bytes]) -> list[bytes]:
        # The block reloads an argument into A, so it must end in a return.
        return [_insn(_JEQ_K, nums[name], jt=0, jf=len(block)), *block]

    prog += guarded(
        "clone",
        [
            _insn(_LD_W_ABS, _arg_low(0)),
            _insn(_JSET_K, _CLONE_NS_MASK, jt=0, jf=1),
            _ret(_errno(errno.EPERM)),
            _ret(_RET_ALLOW),
        ],
    )
    prog += guarded(
        "ioctl",
        [
            _insn(_LD_W_ABS, _arg_low(1)),
            _insn(_JEQ_K, _TIOCSTI, jt=1, jf=0),
            _insn(_JEQ_K, _TIOCLINUX, jt=0, jf=1),
            _ret(_errno(errno.EPERM)),
            _ret(_RET_ALLOW),
        ],
    )
    checks = [
        _insn(_JEQ_K, value, jt=len(_PERSONALITY_OK) - i, jf=0)
        for i, value in enumerate(_PERSONALITY_OK)
    ]
    prog += guarded(
        "personality",
        [
            _insn(_LD_W_ABS, _arg_low(0)),
            *checks,
            _ret(_errno(errno.EPERM)),
            _ret(_RET_ALLOW),
        ],
    )
    for name, index in _MODE_ARG.items():
        if name in nums:  # aarch64 has no chmod, creat, mknod
            prog += guarded(
                name,
                [
                    _insn(_LD_W_ABS, _arg_low(index)),
                    _insn(_JSET_K, _SETID, jt=0, jf=1),
                    _ret(_errno(errno.EPERM)),
                    _ret(_RET_ALLOW),
                ],
            )
    for name, (flags, mode) in _OPEN_ARGS.items():
        if name in nums:  # aarch64 has only openat
            prog += guarded(
                name,
                [
                    _insn(_LD_W_ABS, _arg_low(flags)),
                    _insn(_JSET_K, _OPEN_CREATES, jt=0, jf=3),
                    _insn(_LD_W_ABS, _arg_low(mode)),
                    _insn(_JSET_K, _SETID, jt=0, jf=1),
                    _ret(_errno(errno.EPERM)),
                    _ret(_RET_ALLOW),
                ],
            )
    prog.append(_ret(_RET_ALLOW))
    return b"".join(prog)
