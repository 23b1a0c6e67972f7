# shellcheck shell=bash
# RabbitMQ for tests and the demo, sourced by scripts/test and scripts/demo:
#   rabbitmq_ensure [--management]
#                     install rabbitmq-server with apt when missing, start the node when it is not
#                     running, and wait until AMQP (:5672) answers. With --management (the tests read
#                     queue state over HTTP) also enable the management plugin (and install curl) and wait
#                     for its API (:15672); without it a running broker is left exactly as it was.
#                     Idempotent: about a second when it already runs. Sets RABBITMQ_INSTALLED_NOW=1 /
#                     RABBITMQ_STARTED_NOW=1 when it installed / started the broker.
#   rabbitmq_stop     stop the node and epmd (which keeps :4369 open after the node stops).
# Works as root or, through sudo, as a user who may use it.

RABBITMQ_SUDO=()
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then RABBITMQ_SUDO=(sudo); fi

rabbitmq_port_open() { timeout 2 bash -c '</dev/tcp/127.0.0.1/5672' 2>/dev/null; }

RABBITMQ_INSTALLED_NOW=0
RABBITMQ_STARTED_NOW=0

rabbitmq_ensure() {
  local missing=() i management=0
  if [ "${1:-}" = --management ]; then management=1; fi
  command -v rabbitmq-server >/dev/null 2>&1 || missing+=(rabbitmq-server)
  if [ "$management" = 1 ]; then command -v curl >/dev/null 2>&1 || missing+=(curl); fi
  if [ "${#missing[@]}" -gt 0 ]; then
    echo "installing ${missing[*]} with apt"
    export DEBIAN_FRONTEND=noninteractive
    "${RABBITMQ_SUDO[@]}" apt-get update -qq
    "${RABBITMQ_SUDO[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
    case " ${missing[*]} " in *" rabbitmq-server "*) RABBITMQ_INSTALLED_NOW=1 ;; esac
  fi
  if [ "$management" = 1 ] && ! grep -q rabbitmq_management /etc/rabbitmq/enabled_plugins 2>/dev/null; then
    "${RABBITMQ_SUDO[@]}" rabbitmq-plugins enable --offline rabbitmq_management >/dev/null # HTTP API on :15672
  fi
  if ! "${RABBITMQ_SUDO[@]}" rabbitmq-diagnostics -q ping >/dev/null 2>&1; then
    echo "starting rabbitmq-server"
    "${RABBITMQ_SUDO[@]}" rabbitmq-server -detached
    RABBITMQ_STARTED_NOW=1
  fi
  # await_startup exits at once (code 69) until the node has registered with epmd, so retry it.
  for i in $(seq 1 60); do
    if "${RABBITMQ_SUDO[@]}" rabbitmqctl -q await_startup --timeout 5 >/dev/null 2>&1 && rabbitmq_port_open; then break; fi
    sleep 1
    if [ "$i" = 60 ]; then
      echo "RabbitMQ did not start" >&2
      tail -50 /var/log/rabbitmq/*.log >&2 || true
      return 1
    fi
  done
  if [ "$management" = 0 ]; then
    echo "RabbitMQ $("${RABBITMQ_SUDO[@]}" rabbitmqctl -q version) ready on amqp://127.0.0.1:5672"
    return 0
  fi
  # A node that was already running before the plugin was enabled in the file (a machine whose
  # RabbitMQ was started by its image) does not load it by itself: enable it on the running node.
  if ! curl -sf -u guest:guest http://127.0.0.1:15672/api/overview >/dev/null; then
    "${RABBITMQ_SUDO[@]}" rabbitmq-plugins enable rabbitmq_management >/dev/null
  fi
  for i in $(seq 1 30); do # the management listener comes up a moment after AMQP
    if curl -sf -u guest:guest http://127.0.0.1:15672/api/overview >/dev/null; then break; fi
    sleep 1
    if [ "$i" = 30 ]; then echo "the RabbitMQ management API did not come up on :15672" >&2; return 1; fi
  done
  echo "RabbitMQ $("${RABBITMQ_SUDO[@]}" rabbitmqctl -q version) ready on amqp://guest:guest@127.0.0.1:5672/%2f"
}

rabbitmq_stop() {
  "${RABBITMQ_SUDO[@]}" rabbitmqctl -q stop >/dev/null 2>&1 || true
  "${RABBITMQ_SUDO[@]}" epmd -kill >/dev/null 2>&1 || true
}
