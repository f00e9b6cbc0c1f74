#!/usr/bin/env bash
# Builds Conclave's own image (docs/deploy/Dockerfile) from this checkout: a wheelhouse of the wheel with
# the `postgres` and `queue` extras and every dependency, made on this host with pip, then `docker build`
# of a context that holds only the Dockerfile, the entrypoint and the wheels (the build needs no index).
#
#   bash docs/deploy/build-image.sh [TAG]       # default conclave:<version>; PYTHON=... picks the pip
#
# The wheels are this host's: build on Linux with CPython 3.11 (the image's Python) for the image's
# architecture, or see the Dockerfile for pip's cross-platform flags.
set -euo pipefail
cd "$(dirname "$0")/../.."

python=${PYTHON:-.venv/bin/python}
version=$("$python" -c 'import conclave; print(conclave.__version__)')
tag=${1:-conclave:$version}
context=$(mktemp -d /tmp/conclave-image-XXXXXX)
trap 'rm -rf "$context"' EXIT

cp docs/deploy/Dockerfile docs/deploy/entrypoint.sh "$context/"
# a fixed time in the wheel's zip: an unchanged checkout makes the same bytes, and docker reuses every layer
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-315532800}
# pip resolves markers for this host's Python, not the image's (Debian bookworm's 3.11.2): what the image
# needs beyond that is named here, and the image's own `pip install --no-index` fails on anything missing
image_only=('async-timeout>=4.0.3')  # redis's, on Python < 3.11.3 (the queue extra)
# setuptools copies into build/lib and never deletes there: a module since removed from the checkout
# would still ship in the wheel (a long-lived checkout's image held the old jobs/ beside the new)
rm -rf build/lib build/bdist.*
"$python" -m pip wheel --quiet --disable-pip-version-check --wheel-dir "$context/wheels" \
  '.[postgres,queue]' "${image_only[@]}" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
# the base: the Dockerfile's pin (by digest), pulled; else the engine's copy of it; else its copy of the
# tag alone, said plainly. Which one, with its image id, goes to stderr and into the image's label.
pinned=$(sed -n 's/^ARG BASE=//p' docs/deploy/Dockerfile)
base=$pinned
if ! docker pull --quiet "$pinned" >/dev/null 2>&1 && ! docker image inspect "$pinned" >/dev/null 2>&1; then
  base=${pinned%@*}
  if ! docker image inspect "$base" >/dev/null 2>&1; then
    echo "cannot pull $pinned and the engine has no $base: give it registry access or load the image" >&2
    exit 1
  fi
  echo "could not pull $pinned: building from the engine's own $base, not the pinned image" >&2
fi
used="$base (image $(docker image inspect --format '{{.Id}}' "$base"))"
echo "base: $used" >&2
before=$(docker image inspect --format '{{.Id}}' "$tag" 2>/dev/null || true)
docker build --quiet --build-arg "BASE=$base" --label "conclave.base=$used" --tag "$tag" "$context" >/dev/null
after=$(docker image inspect --format '{{.Id}}' "$tag")
# the image this tag named before, now nameless: removed unless a container still uses it
if [ -n "$before" ] && [ "$before" != "$after" ]; then docker image rm "$before" >/dev/null 2>&1 || true; fi
echo "$tag"
