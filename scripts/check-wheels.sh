#!/usr/bin/env bash
# Proves every distribution is separately installable: each wheel goes alone
# into a fresh venv, with only the dependencies it declares (our own from the
# wheels dir, third-party ones from the package index), and its module imports.
set -euo pipefail
dist=${1:-dist}
uv=$(command -v uv || echo "$PWD/.tools/bin/uv")
declare -A module=(
  [corral_core]=corral [corral_posix_core]=corral_posix [corral_memory]=corral_memory
  [corral_local_bash]=corral_local_bash [corral_local_sandbox]=corral_local_sandbox
  [corral_docker]=corral_docker [corral_conformance]=corral_conformance [corral_mcp]=corral_mcp
  [corral_isolate]=corral_isolate [corral_inspect]=corral_inspect
  [corral_pydantic_ai]=corral_pydantic_ai [corral_openai_agents]=corral_openai_agents
  [corral_langchain]=corral_langchain [corral_deepagents]=corral_deepagents
  [corral_ray]=corral_ray [corral_server]=corral_server
)
# Our wheels keep version 0.1.0 from build to build, and uv caches a find-links wheel
# by its name: without a refresh a dependency (corral-core under corral-docker) would
# come from an earlier run's build on a machine that keeps its uv cache.
refresh=()
for wheel in "$dist"/*.whl; do
  refresh+=(--refresh-package "$(basename "$wheel" | cut -d- -f1 | tr _ -)")
done
status=0
for wheel in "$dist"/*.whl; do
  name=$(basename "$wheel" | cut -d- -f1)
  mod=${module[$name]:?unknown wheel $name}
  venv=$(mktemp -d)
  "$uv" venv --quiet --python python3 "$venv"
  if "$uv" pip install --quiet --python "$venv/bin/python" --find-links "$dist" "${refresh[@]}" "$wheel" \
     && "$venv/bin/python" -c "import $mod" \
     && "$venv/bin/python" -c "import corral; ps = corral.load_plugins(); assert not ps.failed, dict(ps.failed)"; then
    echo "ok    $name -> import $mod; its plugins load"
  else
    echo "FAIL  $name"; status=1
  fi
  if [ "$name" = corral_memory ]; then
    # corral-core + corral-memory alone: the provider is found through its entry point.
    # Print through our own stdout: reopening /dev/stderr by path would truncate a log file.
    listing=$("$venv/bin/corral" providers)
    printf '%s\n' "$listing"
    grep -q '^in-memory' <<<"$listing" || { echo "FAIL  corral providers misses in-memory"; status=1; }
  fi
  rm -rf "$venv"
done
exit $status
