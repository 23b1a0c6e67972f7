# shellcheck shell=bash
# RabbitMQ for tests and the demo, sourced by scripts/test and scripts/demo:
#   rabbitmq_ensure   install rabbitmq-server (and curl) with apt when missing, enable the management
#                     plugin, start the node when it is not running, and wait until AMQP (:5672) and the
#                     management API (:15672) answer. Idempotent: about a second when it already runs.
#   rabbitmq_stop     stop the node and epmd (which keeps :4369 open after the node stops).
# Works as root or, through sudo, as a user who may use it.

RABBITMQ_SUDO=()
if [ "$(id -u)" -ne 0 ] && command -v sudo >/dev/null 2>&1; then RABBITMQ_SUDO=(sudo); fi

rabbitmq_port_open() { timeout 2 bash -c '</dev/tcp/127.0.0.1/5672' 2>/dev/null; }

rabbitmq_ensure() {
  local missing=() i
  command -v rabbitmq-server >/dev/null 2>&1 || missing+=(rabbitmq-server)
  command -v curl >/dev/null 2>&1 || missing+=(curl)
  if [ "${#missing[@]}" -gt 0 ]; then
    echo "installing ${missing[*]} with apt"
    export DEBIAN_FRONTEND=noninteractive
    "${RABBITMQ_SUDO[@]}" apt-get update -qq
    "${RABBITMQ_SUDO[@]}" apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
  if ! grep -q rabbitmq_management /etc/rabbitmq/enabled_plugins 2>/dev/null; then
    "${RABBITMQ_SUDO[@]}" rabbitmq-plugins enable --offline rabbitmq_management >/dev/null # HTTP API on :15672
  fi
  if ! "${RABBITMQ_SUDO[@]}" rabbitmq-diagnostics -q ping >/dev/null 2>&1; then
    echo "starting rabbitmq-server"
    "${RABBITMQ_SUDO[@]}" rabbitmq-server -detached
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
