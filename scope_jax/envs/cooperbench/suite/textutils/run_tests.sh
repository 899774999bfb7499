#!/bin/bash
# Usage: run_tests.sh REPO [TESTS_PATCH [FEATURE_PATCH]]
# As the upstream scripts: resets and cleans the git checkout REPO, applies FEATURE_PATCH, then
# TESTS_PATCH (an empty argument stands for none), and runs the package's tests there with pytest.
set -eu
repo=$1
tests_patch=${2:-}
feature_patch=${3:-}
cd "$repo"
git reset -q --hard
git clean -q -fd
for patch in "$feature_patch" "$tests_patch"; do
    if [ -n "$patch" ]; then
        git apply --whitespace=nowarn "$patch"
    fi
done
export PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
exec python -m pytest -q -p no:cacheprovider -o addopts= tests
