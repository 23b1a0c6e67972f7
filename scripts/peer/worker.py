#!/usr/bin/env python3
"""The worker a user would write instead of volcano-runner: pika and the official `kubernetes` client.

It is the runner's peer in `scripts/peer/compare.py`, which measures both against the same simulator
and RabbitMQ. Per submission it does what a runner does in steady state, no more: it reads the
SubmitJob (JSON), creates the job's namespace once, creates the VolcanoJob and its NetworkPolicy (owned
by the job), publishes QUEUED with publisher confirms and acks the submission. The objects are the
runner's own rendering of the submission (`volcano-runner render`), given as a template whose job id
is replaced: the same bytes reach the API server. What it leaves out is what a user's first worker
leaves out: no validation, no tombstones, no dead-lettering, no redelivery checks.

With `--monitor` it also watches the VolcanoJobs it made and publishes RUNNING once and SUCCESS or
FAILURE at the end, from one watch thread: the part of the runner's monitoring a user would write first
(no leases, no accounting, no recorded state: a restart sends everything again).

Eight threads by default, each with its own AMQP connection (pika is not thread-safe) and its own API
client, consuming with a prefetch of its own.
"""

import argparse
import json
import os
import signal
import sys
import threading
import time
from datetime import datetime, timezone

import pika
from kubernetes import client as k8s
from kubernetes import watch as k8s_watch

GROUP, VERSION, PLURAL = "batch.volcano.sh", "v1alpha1", "jobs"


def now_rfc3339():
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def api_client(server):
    config = k8s.Configuration()
    config.host = server
    config.verify_ssl = False
    return k8s.ApiClient(config)


class Template:
    """The runner's rendering of one submission: the VolcanoJob, its NetworkPolicy, its namespace."""

    def __init__(self, path):
        with open(path) as f:
            rendered = json.load(f)
        items = rendered["items"] if rendered.get("kind") == "List" else rendered
        self.job_id = None
        self.namespace = None
        self.objects = {}
        for obj in items:
            kind = obj["kind"]
            if kind == "Job":
                self.objects["job"] = json.dumps(obj)
                self.namespace = obj["metadata"]["namespace"]
                self.job_id = obj["metadata"]["name"][len("j-"):]
            elif kind == "NetworkPolicy" and obj["metadata"]["name"].startswith("policy-"):
                self.objects["policy"] = json.dumps(obj)
        if self.job_id is None or "policy" not in self.objects:
            sys.exit(f"{path}: no VolcanoJob and NetworkPolicy of a job in the rendering")

    def for_job(self, job_id):
        """The job's VolcanoJob and NetworkPolicy: the template with its job id replaced."""
        swap = lambda text: json.loads(text.replace(self.job_id, job_id))
        return swap(self.objects["job"]), swap(self.objects["policy"])


class Namespaces:
    """Creates each owner's namespace once (a 409 means another thread or run made it)."""

    def __init__(self):
        self.made = set()
        self.lock = threading.Lock()

    def ensure(self, core, name):
        with self.lock:
            if name in self.made:
                return
        try:
            core.create_namespace({"metadata": {"name": name}})
        except k8s.ApiException as e:
            if e.status != 409:
                raise
        with self.lock:
            self.made.add(name)


def event(job_id, state, status, runner_id, **extra):
    body = {
        "eventId": f"{job_id}/{state.removeprefix('JOB_STATE_')}",
        "jobId": job_id,
        "state": state,
        "status": status,
        "timestamp": now_rfc3339(),
        "runnerId": runner_id,
    }
    body.update(extra)
    return body


def publish(channel, args, body):
    channel.basic_publish(
        exchange=args.events_exchange,
        routing_key="job.lifecycle",
        body=json.dumps(body).encode(),
        properties=pika.BasicProperties(
            content_type="application/json",
            type="volcano_runner.v1.JobEvent",
            message_id=body["eventId"],
            delivery_mode=2,
        ),
        mandatory=False,
    )


def consume(args, template, namespaces, index, stop):
    """One consuming thread: its own connection, channel (with confirms) and API client."""
    api = api_client(args.server)
    custom = k8s.CustomObjectsApi(api)
    networking = k8s.NetworkingV1Api(api)
    core = k8s.CoreV1Api(api)
    connection = pika.BlockingConnection(pika.URLParameters(args.amqp))
    channel = connection.channel()
    channel.confirm_delivery()
    channel.basic_qos(prefetch_count=args.prefetch)
    runner_id = f"python-peer-{os.getpid()}-{index}"

    def handle(ch, method, properties, body):
        submission = json.loads(body)
        job_id = submission["jobId"]
        job, policy = template.for_job(job_id)
        ns = job["metadata"]["namespace"]
        namespaces.ensure(core, ns)
        try:
            created = custom.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, job)
        except k8s.ApiException as e:
            if e.status != 409:
                raise
            created = custom.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, job["metadata"]["name"])
        meta = created["metadata"]
        policy["metadata"]["ownerReferences"] = [{
            "apiVersion": f"{GROUP}/{VERSION}", "kind": "Job", "name": meta["name"],
            "uid": meta["uid"], "controller": True,
        }]
        try:
            networking.create_namespaced_network_policy(ns, policy)
        except k8s.ApiException as e:
            if e.status != 409:
                raise
        publish(ch, args, event(job_id, "JOB_STATE_QUEUED", "Your job is queued", runner_id,
                                reason="queued", createdAt=meta.get("creationTimestamp")))
        ch.basic_ack(method.delivery_tag)

    channel.basic_consume(args.submit_queue, handle)
    while not stop.is_set():
        connection.process_data_events(time_limit=0.2)
    connection.close()


def monitor(args, stop):
    """Publishes RUNNING once and the end of every job it sees, from one watch of the VolcanoJobs."""
    api = api_client(args.server)
    custom = k8s.CustomObjectsApi(api)
    connection = pika.BlockingConnection(pika.URLParameters(args.amqp))
    channel = connection.channel()
    channel.confirm_delivery()
    told = {}
    runner_id = f"python-peer-{os.getpid()}-monitor"
    while not stop.is_set():
        stream = k8s_watch.Watch().stream(
            custom.list_cluster_custom_object, GROUP, VERSION, PLURAL, timeout_seconds=5)
        for change in stream:
            job = change["object"]
            name = job["metadata"]["name"]
            if not name.startswith("j-"):
                continue
            job_id = name[len("j-"):]
            phase = job.get("status", {}).get("state", {}).get("phase")
            done = told.get(job_id, set())
            if phase in ("Running", "Completing", "Completed", "Failed") and "RUNNING" not in done:
                publish(channel, args, event(job_id, "JOB_STATE_RUNNING", "Your job is now running",
                                             runner_id, reason="started"))
                done.add("RUNNING")
            if phase in ("Completed", "Failed") and "END" not in done:
                state = "JOB_STATE_SUCCESS" if phase == "Completed" else "JOB_STATE_FAILURE"
                publish(channel, args, event(job_id, state, f"Job {phase.lower()}", runner_id,
                                             reason=phase.lower()))
                done.add("END")
            told[job_id] = done
            connection.process_data_events(time_limit=0)
            if stop.is_set():
                break
    connection.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--amqp", default="amqp://guest:guest@127.0.0.1:5672/%2F")
    parser.add_argument("--server", required=True, help="the Kubernetes API, e.g. http://127.0.0.1:6443")
    parser.add_argument("--template", required=True, help="`volcano-runner render -o json` of a submission")
    parser.add_argument("--submit-queue", required=True)
    parser.add_argument("--events-exchange", required=True)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--prefetch", type=int, default=16)
    parser.add_argument("--monitor", action="store_true")
    args = parser.parse_args()

    template = Template(args.template)
    namespaces = Namespaces()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    threads = [threading.Thread(target=consume, args=(args, template, namespaces, i, stop), daemon=True)
               for i in range(args.threads)]
    if args.monitor:
        threads.append(threading.Thread(target=monitor, args=(args, stop), daemon=True))
    for t in threads:
        t.start()
    print("consuming", flush=True)
    while not stop.is_set():
        time.sleep(0.2)
    for t in threads:
        t.join(timeout=5)


if __name__ == "__main__":
    main()
