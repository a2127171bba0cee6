#!/usr/bin/env bash
# AgentGym's own TextCraft, BabyAI and SciWorld servers, unmodified, each in a throwaway venv of its own, for
# `agent-envs bench-envs --agentgym ENV=URL` (docs/performance.md) and for recording oracle episodes
# (scripts/record_agentgym_babyai.py). Nothing of AgentGym's is copied into this project: the servers are
# installed from the AgentGym checkout you give, with their dependencies from PyPI at the versions AgentGym's
# recordings were made with (the project's constraints.txt pins the same simulators).
#
#   git clone https://github.com/WooooDyy/AgentGym /tmp/AgentGym      # or any checkout of it
#   scripts/agentgym_servers.sh /tmp/AgentGym start                   # builds the venvs once, starts all three
#   scripts/agentgym_servers.sh /tmp/AgentGym status
#   scripts/agentgym_servers.sh /tmp/AgentGym stop
#
# Settings (environment): AGENTGYM_ENVS (default textcraft,babyai,sciworld), AGENTGYM_VENVS (where the venvs
# go, default /tmp/agentgym-venvs), AGENTGYM_RUN (pids and logs, default /tmp/agentgym-run), AGENTGYM_HOST
# (127.0.0.1), AGENTGYM_PORT (the first port, default 36201: textcraft 36201, babyai 36202, sciworld 36203),
# AGENTGYM_PYTHON (python3.11, the Python of AgentGym's recordings; their READMEs ask for 3.8 or newer).
# SciWorld needs a Java runtime (java on PATH). Each server is one uvicorn process, as AgentGym runs it.
set -euo pipefail

usage() { echo "usage: $0 AGENTGYM_CHECKOUT start|stop|status" >&2; exit 2; }
[ $# -eq 2 ] || usage
SRC=$(cd "$1" && pwd) || usage
ACTION=$2
ENVS=${AGENTGYM_ENVS:-textcraft,babyai,sciworld}
VENVS=${AGENTGYM_VENVS:-/tmp/agentgym-venvs}
RUN=${AGENTGYM_RUN:-/tmp/agentgym-run}
HOST=${AGENTGYM_HOST:-127.0.0.1}
PORT=${AGENTGYM_PORT:-36201}
PYTHON=${AGENTGYM_PYTHON:-python3.11}

# Per environment: its port offset and the PyPI packages its server imports. The web stack is left to pip
# (AgentGym pins none of it). TextCraft's pyproject also lists transformers, which its server never imports:
# the package goes in with --no-deps so that a venv does not pull torch.
offset() { case $1 in textcraft) echo 0 ;; babyai) echo 1 ;; sciworld) echo 2 ;; *) return 1 ;; esac; }
deps() {
  case $1 in
    textcraft) echo "fastapi uvicorn gymnasium numpy" ;;
    babyai) echo "fastapi uvicorn minigrid==2.3.1 gymnasium==0.29.1 gym==0.26.2 matplotlib" ;;
    sciworld) echo "fastapi uvicorn scienceworld==1.2.3 py4j==0.10.9.9" ;;
  esac
}

build() {  # the venv of one environment, once (a stamp file marks a finished build)
  local env=$1 venv=$VENVS/$1
  [ -f "$venv/.built" ] && return 0
  [ -d "$SRC/agentenv-$env" ] || { echo "$SRC has no agentenv-$env: is it an AgentGym checkout?" >&2; exit 1; }
  echo "building $venv (AgentGym's agentenv-$env from $SRC)" >&2
  rm -rf "$venv"
  "$PYTHON" -m venv "$venv"
  "$venv/bin/pip" install --quiet $(deps "$env")
  "$venv/bin/pip" install --quiet --no-deps "$SRC/agentenv-$env"
  touch "$venv/.built"
}

alive() { [ -f "$RUN/$1.pid" ] && kill -0 "$(cat "$RUN/$1.pid")" 2>/dev/null; }

start() {  # one uvicorn process in a session of its own (pid = process group: stop ends its JVMs too)
  local env=$1 port=$((PORT + $(offset "$1"))) venv=$VENVS/$1 dir=$RUN
  if alive "$env"; then echo "$env already running (pid $(cat "$RUN/$env.pid"))" >&2; return 0; fi
  if curl -sS -o /dev/null "http://$HOST:$port/" 2>/dev/null; then
    echo "something already answers on $HOST:$port: set AGENTGYM_PORT to a free range" >&2
    exit 1
  fi
  [ "$env" = textcraft ] && dir=$SRC/agentenv-textcraft  # it reads agentenv_textcraft/recipes/ from here
  (
    cd "$dir"
    PYTHONHASHSEED=0 exec setsid "$venv/bin/python" -m uvicorn "agentenv_$env:app" --host "$HOST" \
      --port "$port" --log-level warning >"$RUN/$env.log" 2>&1
  ) &
  echo $! >"$RUN/$env.pid"
  for _ in $(seq 1 600); do  # SciWorld's server starts a JVM at import to list its games
    alive "$env" || break
    if curl -fsS -o /dev/null "http://$HOST:$port/" 2>/dev/null; then echo "$env=http://$HOST:$port"; return 0; fi
    sleep 0.5
  done
  echo "$env did not start; its log ($RUN/$env.log):" >&2
  tail -20 "$RUN/$env.log" >&2
  exit 1
}

stop() {  # the server's whole process group (SciWorld's JVMs are its children); uvicorn takes a few seconds
  local env=$1 pid
  if alive "$env"; then
    pid=$(cat "$RUN/$env.pid")
    kill -TERM -- "-$pid" 2>/dev/null || true
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -KILL -- "-$pid" 2>/dev/null || true  # what is left of the group (a JVM), or the server after 30 s
  fi
  rm -f "$RUN/$env.pid"
}

mkdir -p "$RUN"
IFS=, read -r -a LIST <<<"$ENVS"
for env in "${LIST[@]}"; do offset "$env" >/dev/null || { echo "unknown environment $env" >&2; exit 2; }; done
case $ACTION in
  start)
    for env in "${LIST[@]}"; do build "$env"; done
    for env in "${LIST[@]}"; do start "$env"; done
    ;;
  stop) for env in "${LIST[@]}"; do stop "$env"; done ;;
  status)
    for env in "${LIST[@]}"; do
      if alive "$env"; then echo "$env=http://$HOST:$((PORT + $(offset "$env"))) (pid $(cat "$RUN/$env.pid"))"
      else echo "$env: not running"; fi
    done
    ;;
  *) usage ;;
esac
