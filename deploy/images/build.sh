#!/bin/sh
# `make images`: build every image deploy/ names, tagged as deploy/components/images/kustomization.yaml
# says (the one place tags are set), with whichever of docker, podman or buildah can build here.
#
#   deploy/images/build.sh            build them all
#   deploy/images/build.sh --list     print "name<TAB>reference<TAB>Dockerfile" per image, build nothing
#   deploy/images/build.sh --dry-run  print the build commands the chosen engine would run
#
# CONTAINER_ENGINE=podman (or docker, buildah) picks the engine instead of the first that works.
# Needs only a POSIX shell and awk, so a build machine needs no Python environment.
set -eu

ROOT=$(cd "$(dirname "$0")/../.." && pwd)
COMPONENT="$ROOT/deploy/components/images/kustomization.yaml"
ENGINES="docker podman buildah"

dockerfile_for() {
    case "$1" in
        moeslo) echo "deploy/images/moeslo.Dockerfile" ;;
        moeslo-vllm) echo "deploy/images/vllm.Dockerfile" ;;
        *) echo "build.sh: no Dockerfile builds image '$1' (named in $COMPONENT)" >&2; return 1 ;;
    esac
}

# "name<TAB>reference" for each entry of the component's `images:` (newName, newTag).
images() {
    awk '
        function value(line) {
            sub(/^[^:]*:[ \t]*/, "", line); sub(/[ \t]+#.*$/, "", line); sub(/[ \t]+$/, "", line)
            gsub("\"", "", line); gsub("\047", "", line); return line
        }
        function flush() {
            if (name == "") return
            if (tag == "") { print "build.sh: image " name " has no newTag in the images component" > "/dev/stderr"; bad = 1 }
            printf "%s\t%s:%s\n", name, (new_name != "" ? new_name : name), tag
        }
        /^[ \t]*-[ \t]+name:/ { flush(); name = value($0); new_name = ""; tag = ""; next }
        /^[ \t]+newName:/ { new_name = value($0); next }
        /^[ \t]+newTag:/ { tag = value($0); next }
        /^[ \t]+digest:/ { print "build.sh: a digest cannot be built; set newTag for " name > "/dev/stderr"; bad = 1 }
        END { flush(); exit bad }
    ' "$COMPONENT"
}

# Succeeds when engine $1 can build here; otherwise prints why not.
usable() {
    if ! path=$(command -v "$1" 2>/dev/null); then
        echo "  $1: not installed"
        return 1
    fi
    if out=$("$1" info 2>&1); then
        return 0
    fi
    echo "  $1: found at $path, but \`$1 info\` fails: $(printf '%s\n' "$out" | grep -v '^[[:space:]]*$' | tail -n 1)"
    return 1
}

choose_engine() {
    reasons=""
    for engine in ${CONTAINER_ENGINE:-$ENGINES}; do
        if reason=$(usable "$engine"); then
            echo "$engine"
            return 0
        fi
        reasons="$reasons$reason
"
    done
    {
        echo "make images: no container engine can build here:"
        printf '%s' "$reasons"
        if [ -n "${CONTAINER_ENGINE:-}" ]; then
            echo "(CONTAINER_ENGINE=$CONTAINER_ENGINE was asked for.)"
        fi
        echo "Start the Docker daemon, or install podman or buildah, then run \`make images\` again."
    } >&2
    return 1
}

mode=${1:-build}
list=$(images)
case "$mode" in
    --list)
        printf '%s\n' "$list" | while IFS="$(printf '\t')" read -r name reference; do
            printf '%s\t%s\t%s\n' "$name" "$reference" "$(dockerfile_for "$name")"
        done
        exit 0 ;;
    build|--dry-run) ;;
    *) echo "usage: $0 [--list|--dry-run]" >&2; exit 2 ;;
esac

engine=$(choose_engine)
printf '%s\n' "$list" | while IFS="$(printf '\t')" read -r name reference; do
    dockerfile=$(dockerfile_for "$name")
    case "$engine" in
        buildah) set -- buildah build --file "$ROOT/$dockerfile" --tag "$reference" "$ROOT" ;;
        *) set -- "$engine" build --file "$ROOT/$dockerfile" --tag "$reference" "$ROOT" ;;
    esac
    echo "+ $*"
    if [ "$mode" = build ]; then
        "$@"
    fi
done
if [ "$mode" = build ]; then
    echo "built: $(printf '%s\n' "$list" | cut -f2 | tr '\n' ' ')"
fi
