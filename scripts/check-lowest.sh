#!/usr/bin/env bash
# Run corral-core's tests with corral-core's direct dependencies at the LOWEST
# versions its pyproject allows, so a floor there is a tested promise, not a
# guess. Everything else (the sibling packages the tests load, their own
# dependencies, the test tools) stays at the repository's locked versions.
set -euo pipefail
cd "$(dirname "$0")/.."
UV=${UV:-uv}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# corral-core's own third-party requirements, its re2 extra included.
python3 - >"$work/direct.in" <<'PY'
import tomllib
with open("packages/core/pyproject.toml", "rb") as fh:
    project = tomllib.load(fh)["project"]
for req in [*project["dependencies"], *project.get("optional-dependencies", {}).get("re2", [])]:
    print(req)
PY
"$UV" pip compile --quiet --resolution lowest-direct --python-version 3.11 \
  "$work/direct.in" -o "$work/lowest.txt"
echo "corral-core's direct dependencies at their lowest:"; grep -v '^ *#' "$work/lowest.txt" | sed 's/^/  /'

# Every other third-party package at its locked version, minus what lowest.txt pins.
"$UV" export --quiet --frozen --all-packages --group dev --no-hashes --no-emit-workspace \
  --no-header --no-annotate >"$work/locked-all.txt"
python3 - "$work/lowest.txt" "$work/locked-all.txt" >"$work/locked.txt" <<'PY'
import re, sys
def name(line):
    m = re.match(r"([A-Za-z0-9_.-]+)", line)
    return m.group(1).lower().replace("_", "-") if m else None
lowest = {name(l) for l in open(sys.argv[1]) if l.strip() and not l.lstrip().startswith("#")}
for line in open(sys.argv[2]):
    n = name(line)
    if n and n not in lowest and not line.lstrip().startswith("#"):
        print(line.rstrip())
PY

"$UV" venv --quiet --python 3.11 "$work/venv"
export VIRTUAL_ENV="$work/venv" PATH="$work/venv/bin:$PATH"
"$UV" pip install --quiet --no-deps -r "$work/locked.txt" -r "$work/lowest.txt"
# --no-cache: uv keys a built local tree by its pyproject's mtime, not its sources,
# so a machine that keeps its cache could install an earlier run's build.
"$UV" pip install --quiet --no-deps --no-cache packages/*/
"$UV" pip list --quiet 2>/dev/null | grep -iE "^(anyio|attrs|cattrs|pluggy|trio|regex|google-re2) " \
  | sed "s/^/  installed: /"
python -m pytest packages/core/tests -q -p no:cacheprovider
