#!/usr/bin/env bash
# The main job: set up, build, then run meshtrain's default job. Extra arguments go to meshtrain.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
exec ./"${MT_BUILD_DIR:-build}"/tools/meshtrain "${@:-train}"
