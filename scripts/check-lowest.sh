#!/usr/bin/env bash
# Run corral-core's tests against the LOWEST versions its direct dependencies
# (and those of the packages its tests load: posix-core, memory, local-bash)
# allow, so a floor in a pyproject is a tested promise, not a guess.
set -euo pipefail
cd "$(dirname "$0")/.."
UV=${UV:-uv}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
packages=(core posix-core memory local-bash)

# Third-party requirements of those packages (siblings excluded), core's re2 extra included.
python3 - "${packages[@]}" >"$work/direct.in" <<'PY'
import sys, tomllib
for name in sys.argv[1:]:
    with open(f"packages/{name}/pyproject.toml", "rb") as fh:
        project = tomllib.load(fh)["project"]
    reqs = list(project.get("dependencies", []))
    reqs += project.get("optional-dependencies", {}).get("re2", [])
    for req in reqs:
        if not req.startswith("corral-"):
            print(req)
PY
"$UV" pip compile --quiet --resolution lowest-direct --python-version 3.11 \
  "$work/direct.in" -o "$work/lowest.txt"
echo "lowest direct dependencies:"; grep -v '^ *#' "$work/lowest.txt" | sed 's/^/  /'
"$UV" venv --quiet --python 3.11 "$work/venv"
export VIRTUAL_ENV="$work/venv"
# The test tools at the repository's locked versions; the library's floor at its lowest.
"$UV" export --quiet --frozen --only-group dev --no-hashes --no-emit-workspace \
  | grep -E '^(pytest|hypothesis|iniconfig|packaging|pluggy|sortedcontainers)==' >"$work/tools.txt"
"$UV" pip install --quiet -r "$work/tools.txt"
"$UV" pip install --quiet -r "$work/lowest.txt"
"$UV" pip install --quiet --no-deps "${packages[@]/#/./packages/}"
"$UV" pip list --quiet 2>/dev/null | grep -iE "^(anyio|attrs|cattrs|pluggy|trio|regex) " | sed "s/^/  installed: /"
"$work/venv/bin/python" -m pytest packages/core/tests -q -p no:cacheprovider
