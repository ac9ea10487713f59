#!/bin/sh
# Prepare a Debian machine for corral-docker's real-engine test suite.
#
# Idempotent; prints every action. Needs root (apt-get, dockerd, sshd).
#   1. docker.io from Debian when no docker CLI/daemon is installed;
#   2. dockerd started in the background when the socket does not answer;
#   3. the test image corral-test:latest built locally from busybox-static
#      (no registry access needed), and docker's default image
#      debian:bookworm-slim built with mmdebstrap from Debian's packages,
#      and the code image corral-python:bookworm (python3, numpy,
#      matplotlib, nodejs; about 70 s, skip with CORRAL_SKIP_PYTHON_IMAGE=1);
#   4. with --ssh (or CORRAL_SETUP_SSH=1): an OpenSSH server on
#      127.0.0.1:2222 with a key pair generated now, authorised for root,
#      plus a ~/.ssh/config entry so ssh://root@127.0.0.1:2222 works
#      non-interactively (this is what the docker SDK's paramiko transport
#      uses for remote engines).
#
# Nothing secret is written into the repository: keys live under
# $CORRAL_DOCKER_STATE (default /var/tmp/corral-docker-ci).
set -eu

IMAGE="${CORRAL_DOCKER_IMAGE:-corral-test:latest}"
STATE="${CORRAL_DOCKER_STATE:-/var/tmp/corral-docker-ci}"
SSH_PORT="${CORRAL_SSH_PORT:-2222}"
WANT_SSH="${CORRAL_SETUP_SSH:-0}"
for arg in "$@"; do
    case "$arg" in
        --ssh) WANT_SSH=1 ;;
        --no-ssh) WANT_SSH=0 ;;
        *) echo "usage: $0 [--ssh|--no-ssh]" >&2; exit 2 ;;
    esac
done

say() { echo "ci-setup: $*"; }
APT_UPDATED=0
apt_install() {
    if [ "$APT_UPDATED" = 0 ]; then
        say "apt-get update"
        DEBIAN_FRONTEND=noninteractive apt-get update -q >/dev/null
        APT_UPDATED=1
    fi
    say "apt-get install $*"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "$@" >/dev/null
}

mkdir -p "$STATE"
chmod 700 "$STATE"

# 1. engine -----------------------------------------------------------------
if ! command -v dockerd >/dev/null 2>&1 || ! command -v docker >/dev/null 2>&1; then
    apt_install docker.io
else
    say "docker engine already installed"
fi

# 2. daemon -----------------------------------------------------------------
if docker info >/dev/null 2>&1; then
    say "dockerd already answering"
else
    say "starting dockerd (log: $STATE/dockerd.log)"
    nohup dockerd >"$STATE/dockerd.log" 2>&1 &
    i=0
    until docker info >/dev/null 2>&1; do
        i=$((i + 1))
        if [ "$i" -gt 60 ]; then
            say "dockerd did not come up in 30 s; last log lines:"
            tail -n 20 "$STATE/dockerd.log" >&2 || true
            exit 1
        fi
        sleep 0.5
    done
    say "dockerd is up"
fi

# 3. test image -------------------------------------------------------------
if docker image inspect "$IMAGE" >/dev/null 2>&1; then
    say "image $IMAGE already present"
else
    if [ ! -x /bin/busybox ] || ! /bin/busybox --list >/dev/null 2>&1 \
        || ! ldd /bin/busybox 2>&1 | grep -q "not a dynamic"; then
        apt_install busybox-static
    fi
    ROOTFS="$(mktemp -d)"
    trap 'rm -rf "$ROOTFS"' EXIT
    say "building $IMAGE from busybox-static in $ROOTFS"
    mkdir -p "$ROOTFS/bin" "$ROOTFS/sbin" "$ROOTFS/usr/bin" "$ROOTFS/usr/sbin" \
        "$ROOTFS/etc" "$ROOTFS/tmp" "$ROOTFS/workspace" "$ROOTFS/home/corral" \
        "$ROOTFS/proc" "$ROOTFS/sys" "$ROOTFS/dev"
    cp /bin/busybox "$ROOTFS/bin/busybox"
    chroot "$ROOTFS" /bin/busybox --install -s
    cat >"$ROOTFS/etc/passwd" <<'EOF'
root:x:0:0:root:/root:/bin/sh
corral:x:10001:10001:corral:/home/corral:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
EOF
    cat >"$ROOTFS/etc/group" <<'EOF'
root:x:0:
corral:x:10001:
nogroup:x:65534:
EOF
    chmod 1777 "$ROOTFS/tmp"
    chown 10001:10001 "$ROOTFS/home/corral" "$ROOTFS/workspace"
    tar -C "$ROOTFS" -c . | docker import \
        -c 'ENV PATH=/usr/sbin:/usr/bin:/sbin:/bin' \
        -c 'WORKDIR /workspace' \
        -c 'CMD ["/bin/sh"]' - "$IMAGE" >/dev/null
    say "built $IMAGE"
fi

# 3b. the provider's default image ------------------------------------------
# No registry is reachable in CI: build debian:bookworm-slim (docker's default
# image) from Debian's own packages, so examples that use the defaults run as
# pasted. mmdebstrap's minbase variant is the same package set the official
# slim image carries.
DEFAULT_IMAGE="${CORRAL_DOCKER_DEFAULT_IMAGE:-debian:bookworm-slim}"
if docker image inspect "$DEFAULT_IMAGE" >/dev/null 2>&1; then
    say "image $DEFAULT_IMAGE already present"
else
    command -v mmdebstrap >/dev/null 2>&1 || apt_install mmdebstrap
    say "building $DEFAULT_IMAGE with mmdebstrap (minbase, bookworm)"
    mmdebstrap --variant=minbase --quiet bookworm - \
        | docker import -c 'CMD ["bash"]' - "$DEFAULT_IMAGE" >/dev/null
    say "built $DEFAULT_IMAGE"
fi

# 3c. the code image: python3 (+ numpy, matplotlib) and node ---------------
# The `code` capability's driver and `workspace_run_code` need an interpreter
# in the box; busybox has none. Built like 3b from Debian's packages (no
# registry), so matplotlib draws headless PNGs (its Agg backend needs no
# display). Skip with CORRAL_SKIP_PYTHON_IMAGE=1.
PYTHON_IMAGE="${CORRAL_DOCKER_CODE_IMAGE:-corral-python:bookworm}"
if [ "${CORRAL_SKIP_PYTHON_IMAGE:-0}" = 1 ]; then
    say "skipping $PYTHON_IMAGE (CORRAL_SKIP_PYTHON_IMAGE=1)"
elif docker image inspect "$PYTHON_IMAGE" >/dev/null 2>&1; then
    say "image $PYTHON_IMAGE already present"
else
    command -v mmdebstrap >/dev/null 2>&1 || apt_install mmdebstrap
    say "building $PYTHON_IMAGE with mmdebstrap (minbase + python3, numpy, matplotlib, nodejs)"
    mmdebstrap --variant=minbase --quiet \
        --include=python3,python3-numpy,python3-matplotlib,nodejs \
        --customize-hook='chroot "$1" python3 -c "import matplotlib, numpy"' \
        bookworm - \
        | docker import -c 'ENV MPLBACKEND=Agg' -c 'CMD ["python3"]' - "$PYTHON_IMAGE" >/dev/null
    say "built $PYTHON_IMAGE"
fi

# 4. ssh endpoint for the remote-engine mode --------------------------------
if [ "$WANT_SSH" = 1 ]; then
    if ! command -v sshd >/dev/null 2>&1 && [ ! -x /usr/sbin/sshd ]; then
        apt_install openssh-server openssh-client
    else
        say "openssh-server already installed"
    fi
    KEY="$STATE/id_ed25519"
    if [ ! -f "$KEY" ]; then
        say "generating client key $KEY"
        ssh-keygen -q -t ed25519 -N '' -C corral-docker-ci -f "$KEY"
    fi
    if [ ! -f "$STATE/ssh_host_ed25519_key" ]; then
        say "generating host key"
        ssh-keygen -q -t ed25519 -N '' -f "$STATE/ssh_host_ed25519_key"
    fi
    cp "$KEY.pub" "$STATE/authorized_keys"
    chmod 600 "$STATE/authorized_keys"
    cat >"$STATE/sshd_config" <<EOF
Port $SSH_PORT
ListenAddress 127.0.0.1
HostKey $STATE/ssh_host_ed25519_key
PidFile $STATE/sshd.pid
AuthorizedKeysFile $STATE/authorized_keys
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
AllowStreamLocalForwarding yes
Subsystem sftp internal-sftp
EOF
    mkdir -p /run/sshd
    if [ -f "$STATE/sshd.pid" ] && kill -0 "$(cat "$STATE/sshd.pid")" 2>/dev/null; then
        say "sshd already running on 127.0.0.1:$SSH_PORT"
    else
        say "starting sshd on 127.0.0.1:$SSH_PORT"
        "$(command -v sshd || echo /usr/sbin/sshd)" -f "$STATE/sshd_config" -E "$STATE/sshd.log"
    fi
    mkdir -p "$HOME/.ssh"
    chmod 700 "$HOME/.ssh"
    HOSTLINE="[127.0.0.1]:$SSH_PORT $(cut -d' ' -f1,2 "$STATE/ssh_host_ed25519_key.pub")"
    touch "$HOME/.ssh/known_hosts"
    if ! grep -qxF "$HOSTLINE" "$HOME/.ssh/known_hosts"; then
        say "recording the host key in ~/.ssh/known_hosts"
        grep -v "^\[127.0.0.1\]:$SSH_PORT " "$HOME/.ssh/known_hosts" >"$STATE/known_hosts.tmp" || true
        echo "$HOSTLINE" >>"$STATE/known_hosts.tmp"
        cat "$STATE/known_hosts.tmp" >"$HOME/.ssh/known_hosts"
        rm -f "$STATE/known_hosts.tmp"
    fi
    touch "$HOME/.ssh/config"
    chmod 600 "$HOME/.ssh/config"
    if ! grep -q "# corral-docker-ci" "$HOME/.ssh/config"; then
        say "adding a Host 127.0.0.1 entry to ~/.ssh/config"
        {
            echo "# corral-docker-ci"
            echo "Host 127.0.0.1"
            echo "    Port $SSH_PORT"
            echo "    User root"
            echo "    IdentityFile $KEY"
            echo "    IdentitiesOnly yes"
            echo "    BatchMode yes"
        } >>"$HOME/.ssh/config"
    fi
    i=0
    until ssh -o BatchMode=yes -p "$SSH_PORT" root@127.0.0.1 true 2>/dev/null; do
        i=$((i + 1))
        if [ "$i" -gt 20 ]; then
            say "ssh to root@127.0.0.1:$SSH_PORT does not work; see $STATE/sshd.log"
            exit 1
        fi
        sleep 0.25
    done
    say "ssh://root@127.0.0.1:$SSH_PORT works"
fi
say "done"
