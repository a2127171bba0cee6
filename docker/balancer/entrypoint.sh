#!/bin/sh
# Balancer entrypoint: render the ONE nginx template (configs/nginx/webshop.conf.template, the same file
# `make up-local` renders) for docker compose, check it with `nginx -t`, then run nginx in the foreground.
#
#   webshop-balancer            render, check, exec nginx (the container's default)
#   webshop-balancer check      render and check only (what tests/deploy runs against a real nginx >= 1.27.3)
#
# In compose the upstream is the Docker DNS name of the scaled `webshop` service. nginx resolves it at run time
# (`resolve`, open source since nginx 1.27.3), through Docker's embedded DNS server, and re-resolves it every
# 10 s, so `docker compose up --scale webshop=N` and replaced replicas are picked up without a reload.
# `resolve` needs the upstream in shared memory (`zone`) and a resolver: both go into the upstream block
# through WEBSHOP_UPSTREAMS (the template substitutes it into both of its upstream blocks, which then share
# one zone). Because names are resolved at run time, `nginx -t` needs no DNS: it really checks the syntax.
#
# Settings (environment):
#   WEBSHOP_BACKEND            replicas as host:port           (default webshop:8000)
#   WEBSHOP_RESOLVER           DNS server for WEBSHOP_BACKEND  (default 127.0.0.11, Docker's embedded DNS)
#   WEBSHOP_UPSTREAMS          complete upstream lines; when set, replaces the two above
#   WEBSHOP_ENVS               the environments served (default webshop): each must be one the balancer routes
#                              (listed in the environments directory's placements.txt), else the start stops; with
#                              a sticky one among them (SciWorld), the sticky upstream goes to
#   WEBSHOP_SCIWORLD_BACKEND   the sticky environments' replicas as host:port (compose: its sciworld service,
#                              sciworld:8000), resolved like the above
#   WEBSHOP_AFFINITY_UPSTREAMS complete lines of the sticky upstream; when set, replaces the two above
#   WEBSHOP_SESSION_UPSTREAMS  complete lines of the AgentGym routes' upstream (default: WEBSHOP_UPSTREAMS)
#   WEBSHOP_LISTEN_PORT        listen port inside the container (default 8080)
#   WEBSHOP_NGINX_RUNTIME_DIR  pid, temp files and the rendered nginx.conf (default /tmp/nginx; writable by
#                              the non-root user, a tmpfs under a read-only root file system)
#   WEBSHOP_NGINX_ACCESS_LOG   default /dev/stdout (JSON lines)
#   WEBSHOP_NGINX_ERROR_LOG    default stderr
#   WEBSHOP_NGINX_TEMPLATE     template path (default /etc/webshop/webshop.conf.template)
#   WEBSHOP_NGINX_ENVIRONMENTS the environments' generated routes: maps.conf, locations.conf and placements.txt
#                              (default: the directory environments/ next to the template; configs/nginx/environments/
#                              in the repository, written by `agent-envs envs --write-deploy` from the registrations)
#   WEBSHOP_ENV_MAPS, WEBSHOP_ENV_LOCATIONS  when set, replace maps.conf and locations.conf
#   NGINX_BIN                  nginx binary (default nginx)
# Every ${WEBSHOP_*} placeholder the template contains must have a value: one it does not know stops the
# start with its name, instead of an nginx.conf with a hole in it.
set -eu

WEBSHOP_BACKEND="${WEBSHOP_BACKEND:-webshop:8000}"
WEBSHOP_RESOLVER="${WEBSHOP_RESOLVER:-127.0.0.11}"
WEBSHOP_LISTEN_PORT="${WEBSHOP_LISTEN_PORT:-8080}"
WEBSHOP_NGINX_RUNTIME_DIR="${WEBSHOP_NGINX_RUNTIME_DIR:-/tmp/nginx}"
WEBSHOP_NGINX_ACCESS_LOG="${WEBSHOP_NGINX_ACCESS_LOG:-/dev/stdout}"
WEBSHOP_NGINX_ERROR_LOG="${WEBSHOP_NGINX_ERROR_LOG:-stderr}"
template="${WEBSHOP_NGINX_TEMPLATE:-/etc/webshop/webshop.conf.template}"
nginx_bin="${NGINX_BIN:-nginx}"

if [ -z "${WEBSHOP_UPSTREAMS:-}" ]; then
    # A shared zone (every nginx worker sees the same failure counts); ipv6=off because Docker's
    # embedded DNS answers A records for service names.
    WEBSHOP_UPSTREAMS="        zone webshop_upstreams 512k;
        resolver ${WEBSHOP_RESOLVER} valid=10s ipv6=off;
        resolver_timeout 5s;
        server ${WEBSHOP_BACKEND} max_fails=1 fail_timeout=10s resolve;
        server ${WEBSHOP_BACKEND} max_fails=0 backup resolve;"
fi
# (the backup line: the same replicas once more, never marked failed, tried only when every replica above is
# marked failed, e.g. one crashed and another timed out once under load: the step goes to them instead of a 502.
# The hash-balanced upstreams below refuse backup servers: they get the lines without it.)
# The environments the balancer routes (generated from their registrations): WEBSHOP_ENVS must name only those. An
# environment without routes of its own would fall through to the catch-all location, whose short timeouts and
# retries are for the service's own stateless routes: refuse to start instead.
environments="${WEBSHOP_NGINX_ENVIRONMENTS:-$(dirname "$template")/environments}"
if [ ! -r "$environments/placements.txt" ]; then
    echo "webshop-balancer: $environments/placements.txt not found (the environments' routes)" >&2
    exit 66
fi
sticky=no
for env in $(printf '%s' "${WEBSHOP_ENVS:-webshop}" | tr ',' ' '); do
    placement=$(awk -v env="$env" '$1 == env { print $2 }' "$environments/placements.txt")
    case "$placement" in
        sticky) sticky=yes ;;
        any) ;;
        *)
            echo "webshop-balancer: WEBSHOP_ENVS names $env, which the balancer does not route (not in" \
                "$environments/placements.txt): register it and regenerate the routes (agent-envs envs" \
                "--write-deploy), or leave it out of WEBSHOP_ENVS" >&2
            exit 65
            ;;
    esac
done
if [ -z "${WEBSHOP_ENV_MAPS:-}" ]; then
    WEBSHOP_ENV_MAPS=$(cat "$environments/maps.conf")
fi
if [ -z "${WEBSHOP_ENV_LOCATIONS:-}" ]; then
    WEBSHOP_ENV_LOCATIONS=$(cat "$environments/locations.conf")
fi
# The sticky upstream (by episode, a zone of its own): the sticky environments' own replicas when WEBSHOP_ENVS names
# one (compose runs SciWorld's as a service of its own, with Java), else the same servers as above (which answer
# 404 for an environment they do not serve).
if [ -n "${WEBSHOP_AFFINITY_UPSTREAMS:-}" ]; then
    :
elif [ "$sticky" = yes ] && [ -n "${WEBSHOP_SCIWORLD_BACKEND:-}" ]; then
    WEBSHOP_AFFINITY_UPSTREAMS="        zone affinity_upstreams 512k;
        resolver ${WEBSHOP_RESOLVER} valid=10s ipv6=off;
        resolver_timeout 5s;
        server ${WEBSHOP_SCIWORLD_BACKEND} max_fails=1 fail_timeout=10s resolve;"
else
    WEBSHOP_AFFINITY_UPSTREAMS=$(printf '%s\n' "$WEBSHOP_UPSTREAMS" | sed -e '/ backup[^;]*;$/d' -e 's/zone webshop_upstreams/zone affinity_upstreams/')
fi
# The AgentGym routes' upstream (by session id): the same servers in a zone of its own.
if [ -z "${WEBSHOP_SESSION_UPSTREAMS:-}" ]; then
    WEBSHOP_SESSION_UPSTREAMS=$(printf '%s\n' "$WEBSHOP_UPSTREAMS" | sed -e '/ backup[^;]*;$/d' -e 's/zone webshop_upstreams/zone session_upstreams/')
fi
export WEBSHOP_UPSTREAMS WEBSHOP_SESSION_UPSTREAMS WEBSHOP_AFFINITY_UPSTREAMS WEBSHOP_ENV_MAPS WEBSHOP_ENV_LOCATIONS \
    WEBSHOP_LISTEN_PORT WEBSHOP_NGINX_RUNTIME_DIR WEBSHOP_NGINX_ACCESS_LOG WEBSHOP_NGINX_ERROR_LOG

if [ ! -r "$template" ]; then
    echo "webshop-balancer: template $template not found" >&2
    exit 66
fi

# The placeholders the template uses, e.g. "${WEBSHOP_UPSTREAMS} ${WEBSHOP_LISTEN_PORT} ...": envsubst
# replaces only these, so nginx's own $variables stay as they are. (Single quotes on purpose: a literal
# dollar-brace is the pattern.)
# shellcheck disable=SC2016
placeholders=$(grep -o '\${WEBSHOP_[A-Z0-9_]*}' "$template" | sort -u | tr '\n' ' ')
for placeholder in $placeholders; do
    name=${placeholder#??}
    name=${name%?}
    eval "is_set=\${$name+yes}"
    if [ "${is_set:-}" != yes ]; then
        echo "webshop-balancer: the template needs $name, which is not set" >&2
        exit 64
    fi
    export "${name?}"
done

mkdir -p "$WEBSHOP_NGINX_RUNTIME_DIR"
conf="$WEBSHOP_NGINX_RUNTIME_DIR/nginx.conf"
envsubst "$placeholders" <"$template" >"$conf"

# -e stderr: the log nginx uses before it has read the config (not the image's /var/log, which a non-root
# user under a read-only root file system may not open).
"$nginx_bin" -e stderr -t -q -p "$WEBSHOP_NGINX_RUNTIME_DIR" -c "$conf"
if [ "${1:-}" = check ]; then
    echo "webshop-balancer: $conf is valid"
    exit 0
fi
exec "$nginx_bin" -e stderr -p "$WEBSHOP_NGINX_RUNTIME_DIR" -c "$conf"
