"""The BPF program: a tiny interpreter checks its decisions; bwrap loads it for real."""

from __future__ import annotations

import errno
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral_local_sandbox import build_filter, denied_syscalls, native_arch
from corral_local_sandbox._seccomp import ARCHES, SeccompArch

ALLOW = 0x7FFF0000
KILL = 0x80000000
EPERM = 0x00050000 | errno.EPERM
ENOSYS = 0x00050000 | errno.ENOSYS
CLONE_NS_MASK = 0x7E020000
SETID = 0o6000
O_CREAT, O_TMPFILE = 0o100, 0o20200000
# name -> (index of the mode argument, index of the flags argument or None), per the
# kernel's prototypes; the same indexes on x86-64 and aarch64.
MODE_ARGS = {
    "chmod": (1, None),
    "fchmod": (1, None),
    "fchmodat": (2, None),
    "fchmodat2": (2, None),
    "creat": (1, None),
    "mknod": (1, None),
    "mknodat": (2, None),
    "open": (2, 1),
    "openat": (3, 2),
}
MODE_CHECKED = tuple(MODE_ARGS)


def evaluate(program: bytes, nr: int, arch: int, args: tuple[int, ...] = (0,) * 6) -> int:
    """Run a classic-BPF seccomp program on one ``seccomp_data`` (the opcodes we emit)."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, *args)
    insns = [struct.unpack_from("<HBBI", program, off) for off in range(0, len(program), 8)]
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = insns[pc]
        pc += 1
        if code == 0x20:
            acc = struct.unpack_from("<I", data, k)[0]
        elif code == 0x06:
            return k
        elif code in (0x15, 0x35, 0x45):
            hit = {0x15: acc == k, 0x35: acc >= k, 0x45: bool(acc & k)}[code]
            pc += jt if hit else jf
        else:
            raise AssertionError(f"unexpected opcode {code:#x}")


@pytest.mark.parametrize("arch", sorted(ARCHES))
def test_denied_syscalls_get_their_errno(arch: str) -> None:
    spec = ARCHES[arch]
    program = build_filter(spec)
    assert len(program) % 8 == 0
    assert len(program) // 8 < 4096
    for name, action in denied_syscalls().items():
        if name not in spec.numbers:  # a legacy call this arch never had (aarch64: chmod)
            assert name in MODE_ARGS, name
            assert arch != "x86_64", name
            continue
        nr = spec.numbers[name]
        if action in ("EPERM", "ENOSYS"):
            expected = EPERM if action == "EPERM" else ENOSYS
            assert evaluate(program, nr, spec.audit_arch) == expected, name


def _arch() -> SeccompArch:
    return ARCHES["x86_64"]


@settings(max_examples=100, deadline=None)
@given(nr=st.integers(0, 600))
def test_other_syscalls_are_allowed(nr: int) -> None:
    spec = _arch()
    program = build_filter(spec)
    touched = {spec.numbers[n] for n in denied_syscalls()}
    result = evaluate(program, nr, spec.audit_arch)
    checked = {spec.numbers[n] for n in ("clone", "ioctl", "personality", *MODE_CHECKED)}
    if nr in touched and nr not in checked:
        assert result in (EPERM, ENOSYS)
    elif nr not in touched:
        assert result == ALLOW


@settings(max_examples=100, deadline=None)
@given(flags=st.integers(0, 2**64 - 1))
def test_clone_is_refused_exactly_with_namespace_flags(flags: int) -> None:
    spec = _arch()
    result = evaluate(
        build_filter(spec), spec.numbers["clone"], spec.audit_arch, (flags, 0, 0, 0, 0, 0)
    )
    assert result == (EPERM if flags & CLONE_NS_MASK else ALLOW)


@settings(max_examples=50, deadline=None)
@given(high=st.integers(0, 2**32 - 1), request=st.sampled_from([0x5412, 0x541C, 0x5401, 0x541B]))
def test_ioctl_checks_only_the_low_32_bits_of_the_request(high: int, request: int) -> None:
    # The kernel truncates the request to unsigned int: high bits must not bypass the check.
    spec = _arch()
    arg = (high << 32) | request
    result = evaluate(
        build_filter(spec), spec.numbers["ioctl"], spec.audit_arch, (0, arg, 0, 0, 0, 0)
    )
    assert result == (EPERM if request in (0x5412, 0x541C) else ALLOW)


@pytest.mark.parametrize(
    ("persona", "allowed"), [(0, True), (8, True), (0xFFFFFFFF, True), (0x0040000, False)]
)
def test_personality(persona: int, allowed: bool) -> None:
    spec = _arch()
    result = evaluate(
        build_filter(spec), spec.numbers["personality"], spec.audit_arch, (persona, 0, 0, 0, 0, 0)
    )
    assert result == (ALLOW if allowed else EPERM)


def test_foreign_arch_and_x32_are_killed() -> None:
    spec = _arch()
    program = build_filter(spec)
    assert evaluate(program, 0, 0x40000003) == KILL  # i386
    assert evaluate(program, 0x40000000 + 1, spec.audit_arch) == KILL  # x32 write


def test_native_arch_is_supported_here() -> None:
    assert native_arch() is not None


@pytest.mark.parametrize("arch", sorted(ARCHES))
def test_every_mode_setting_call_is_checked_on_every_arch(arch: str) -> None:
    spec = ARCHES[arch]
    present = {n for n in MODE_ARGS if n in spec.numbers}
    # aarch64 has only the *at calls; x86-64 has the legacy ones too.
    assert {"fchmod", "fchmodat", "fchmodat2", "openat", "mknodat"} <= present
    if arch == "x86_64":
        assert present == set(MODE_ARGS)
    assert evaluate(build_filter(spec), spec.numbers["openat2"], spec.audit_arch) == ENOSYS


@settings(max_examples=200, deadline=None)
@given(
    arch=st.sampled_from(sorted(ARCHES)),
    name=st.sampled_from(MODE_CHECKED),
    mode=st.integers(0, 2**64 - 1),
    flags=st.sampled_from([0, O_CREAT, O_TMPFILE, 0o1, 0o2 | O_CREAT, 0o2000000]),
    noise=st.integers(0, 2**64 - 1),
)
def test_set_id_modes_are_refused(arch: str, name: str, mode: int, flags: int, noise: int) -> None:
    spec = ARCHES[arch]
    if name not in spec.numbers:
        return
    mode_at, flags_at = MODE_ARGS[name]
    args = [noise] * 6
    args[mode_at] = mode
    if flags_at is not None:
        args[flags_at] = flags
    result = evaluate(build_filter(spec), spec.numbers[name], spec.audit_arch, tuple(args))
    # The kernel reads the mode as a 32-bit umode_t: only its low bits count.
    refused = bool(mode & SETID)
    if flags_at is not None:
        refused = refused and bool(flags & (O_CREAT | O_TMPFILE))
    assert result == (EPERM if refused else ALLOW)
