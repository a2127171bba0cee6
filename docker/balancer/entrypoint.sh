#!/bin/sh
# Balancer entrypoint: render the ONE nginx template (configs/nginx/balancer.conf.template, the same file
# `make up-local` renders) for docker compose, check it with `nginx -t`, then run nginx in the foreground.
#
#   agentrl-balancer            render, check, exec nginx (the container's default)
#   agentrl-balancer check      render and check only (what tests/deploy runs against a real nginx >= 1.27.3)
#
# In compose the upstream is the Docker DNS name of the scaled `envs` service. nginx resolves it at run time
# (`resolve`, open source since nginx 1.27.3), through Docker's embedded DNS server, and re-resolves it every
# 10 s, so `docker compose up --scale envs=N` and replaced replicas are picked up without a reload.
# `resolve` needs the upstream in shared memory (`zone`) and a resolver: both go into the upstream block
# through AGENTRL_UPSTREAMS (the template substitutes it into both of its upstream blocks, which then share
# one zone). Because names are resolved at run time, `nginx -t` needs no DNS: it really checks the syntax.
#
# Settings (environment):
#   AGENTRL_BACKEND            replicas as host:port           (default envs:8000)
#   AGENTRL_RESOLVER           DNS server for AGENTRL_BACKEND  (default 127.0.0.11, Docker's embedded DNS)
#   AGENTRL_UPSTREAMS          complete upstream lines; when set, replaces the two above
#   AGENTRL_ENVS               the environments served (default webshop): each must be one the balancer routes
#                              (listed in the environments directory's placements.txt), else the start stops; with
#                              a sticky one among them (SciWorld), the sticky upstream goes to
#   AGENTRL_SCIWORLD_BACKEND   the sticky environments' replicas as host:port (compose: its sciworld service,
#                              sciworld:8000), resolved like the above
#   AGENTRL_AFFINITY_UPSTREAMS complete lines of the sticky upstream; when set, replaces the two above
#   AGENTRL_SESSION_UPSTREAMS  complete lines of the AgentGym routes' upstream (default: AGENTRL_UPSTREAMS)
#   AGENTRL_LISTEN_PORT        listen port inside the container (default 8080)
#   AGENTRL_NGINX_RUNTIME_DIR  pid, temp files and the rendered nginx.conf (default /tmp/nginx; writable by
#                              the non-root user, a tmpfs under a read-only root file system)
#   AGENTRL_NGINX_ACCESS_LOG   default /dev/stdout (JSON lines)
#   AGENTRL_NGINX_ERROR_LOG    default stderr
#   AGENTRL_NGINX_TEMPLATE     template path (default /etc/agentrl/balancer.conf.template)
#   AGENTRL_NGINX_ENVIRONMENTS the environments' generated routes: maps.conf, locations.conf and placements.txt
#                              (default: the directory environments/ next to the template; configs/nginx/environments/
#                              in the repository, written by `agent-envs envs --write-deploy` from the registrations)
#   AGENTRL_ENV_MAPS, AGENTRL_ENV_LOCATIONS  when set, replace maps.conf and locations.conf
#   NGINX_BIN                  nginx binary (default nginx)
# Every ${AGENTRL_*} placeholder the template contains must have a value: one it does not know stops the
# start with its name, instead of an nginx.conf with a hole in it.
set -eu

AGENTRL_BACKEND="${AGENTRL_BACKEND:-envs:8000}"
AGENTRL_RESOLVER="${AGENTRL_RESOLVER:-127.0.0.11}"
AGENTRL_LISTEN_PORT="${AGENTRL_LISTEN_PORT:-8080}"
AGENTRL_NGINX_RUNTIME_DIR="${AGENTRL_NGINX_RUNTIME_DIR:-/tmp/nginx}"
AGENTRL_NGINX_ACCESS_LOG="${AGENTRL_NGINX_ACCESS_LOG:-/dev/stdout}"
AGENTRL_NGINX_ERROR_LOG="${AGENTRL_NGINX_ERROR_LOG:-stderr}"
template="${AGENTRL_NGINX_TEMPLATE:-/etc/agentrl/balancer.conf.template}"
nginx_bin="${NGINX_BIN:-nginx}"

if [ -z "${AGENTRL_UPSTREAMS:-}" ]; then
    # A shared zone (every nginx worker sees the same failure counts); ipv6=off because Docker's
    # embedded DNS answers A records for service names.
    AGENTRL_UPSTREAMS="        zone env_upstreams 512k;
        resolver ${AGENTRL_RESOLVER} valid=10s ipv6=off;
        resolver_timeout 5s;
        server ${AGENTRL_BACKEND} max_fails=1 fail_timeout=10s resolve;
        server ${AGENTRL_BACKEND} max_fails=0 backup resolve;"
fi
# (the backup line: the same replicas once more, never marked failed, tried only when every replica above is
# marked failed, e.g. one crashed and another timed out once under load: the step goes to them instead of a 502.
# The hash-balanced upstreams below refuse backup servers: they get the lines without it.)
# The environments the balancer routes (generated from their registrations): AGENTRL_ENVS must name only those. An
# environment without routes of its own would fall through to the catch-all location, whose short timeouts and
# retries are for the service's own stateless routes: refuse to start instead.
environments="${AGENTRL_NGINX_ENVIRONMENTS:-$(dirname "$template")/environments}"
if [ ! -r "$environments/placements.txt" ]; then
    echo "agentrl-balancer: $environments/placements.txt not found (the environments' routes)" >&2
    exit 66
fi
sticky=no
for env in $(printf '%s' "${AGENTRL_ENVS:-webshop}" | tr ',' ' '); do
    placement=$(awk -v env="$env" '$1 == env { print $2 }' "$environments/placements.txt")
    case "$placement" in
        sticky) sticky=yes ;;
        any) ;;
        *)
            echo "agentrl-balancer: AGENTRL_ENVS names $env, which the balancer does not route (not in" \
                "$environments/placements.txt): register it and regenerate the routes (agent-envs envs" \
                "--write-deploy), or leave it out of AGENTRL_ENVS" >&2
            exit 65
            ;;
    esac
done
if [ -z "${AGENTRL_ENV_MAPS:-}" ]; then
    AGENTRL_ENV_MAPS=$(cat "$environments/maps.conf")
fi
if [ -z "${AGENTRL_ENV_LOCATIONS:-}" ]; then
    AGENTRL_ENV_LOCATIONS=$(cat "$environments/locations.conf")
fi
# The sticky upstream (by episode, a zone of its own): the sticky environments' own replicas when AGENTRL_ENVS names
# one (compose runs SciWorld's as a service of its own, with Java), else the same servers as above (which answer
# 404 for an environment they do not serve).
if [ -n "${AGENTRL_AFFINITY_UPSTREAMS:-}" ]; then
    :
elif [ "$sticky" = yes ] && [ -n "${AGENTRL_SCIWORLD_BACKEND:-}" ]; then
    AGENTRL_AFFINITY_UPSTREAMS="        zone affinity_upstreams 512k;
        resolver ${AGENTRL_RESOLVER} valid=10s ipv6=off;
        resolver_timeout 5s;
        server ${AGENTRL_SCIWORLD_BACKEND} max_fails=1 fail_timeout=10s resolve;"
else
    AGENTRL_AFFINITY_UPSTREAMS=$(printf '%s\n' "$AGENTRL_UPSTREAMS" | sed -e '/ backup[^;]*;$/d' -e 's/zone env_upstreams/zone affinity_upstreams/')
fi
# The AgentGym routes' upstream (by session id): the same servers in a zone of its own.
if [ -z "${AGENTRL_SESSION_UPSTREAMS:-}" ]; then
    AGENTRL_SESSION_UPSTREAMS=$(printf '%s\n' "$AGENTRL_UPSTREAMS" | sed -e '/ backup[^;]*;$/d' -e 's/zone env_upstreams/zone session_upstreams/')
fi
export AGENTRL_UPSTREAMS AGENTRL_SESSION_UPSTREAMS AGENTRL_AFFINITY_UPSTREAMS AGENTRL_ENV_MAPS AGENTRL_ENV_LOCATIONS \
    AGENTRL_LISTEN_PORT AGENTRL_NGINX_RUNTIME_DIR AGENTRL_NGINX_ACCESS_LOG AGENTRL_NGINX_ERROR_LOG

if [ ! -r "$template" ]; then
    echo "agentrl-balancer: template $template not found" >&2
    exit 66
fi

# The placeholders the template uses, e.g. "${AGENTRL_UPSTREAMS} ${AGENTRL_LISTEN_PORT} ...": envsubst
# replaces only these, so nginx's own $variables stay as they are. (Single quotes on purpose: a literal
# dollar-brace is the pattern.)
# shellcheck disable=SC2016
placeholders=$(grep -o '\${AGENTRL_[A-Z0-9_]*}' "$template" | sort -u | tr '\n' ' ')
for placeholder in $placeholders; do
    name=${placeholder#??}
    name=${name%?}
    eval "is_set=\${$name+yes}"
    if [ "${is_set:-}" != yes ]; then
        echo "agentrl-balancer: the template needs $name, which is not set" >&2
        exit 64
    fi
    export "${name?}"
done

mkdir -p "$AGENTRL_NGINX_RUNTIME_DIR"
conf="$AGENTRL_NGINX_RUNTIME_DIR/nginx.conf"
envsubst "$placeholders" <"$template" >"$conf"

# -e stderr: the log nginx uses before it has read the config (not the image's /var/log, which a non-root
# user under a read-only root file system may not open).
"$nginx_bin" -e stderr -t -q -p "$AGENTRL_NGINX_RUNTIME_DIR" -c "$conf"
if [ "${1:-}" = check ]; then
    echo "agentrl-balancer: $conf is valid"
    exit 0
fi
exec "$nginx_bin" -e stderr -p "$AGENTRL_NGINX_RUNTIME_DIR" -c "$conf"
