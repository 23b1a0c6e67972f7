#!/usr/bin/env python3
"""Interleaved trials: volcano-runner against the Python worker a user would write (scripts/peer/worker.py).

Each trial gets a fresh simulator (`volcano-runner sim`, its clock at real speed) and exchanges and
queues of its own on the real RabbitMQ, publishes N figlet submissions as fast as confirms allow, and
times them from the first publication to the last event awaited: every QUEUED without monitoring, every
terminal event with it (each job runs 2 s on 40 nodes of 64 cpus, so none waits for room), as a
sustained rate between the first and the last tenth of those events, as `bench` does. The two
contenders take turns, the order swapped every round, so that a machine that slows down or speeds up
during the run weighs on both alike. Prints each trial, then per mode the median rates and their ratio
(runner / peer).

    scripts/peer/compare.py --bin target/release/volcano-runner --submissions 2000 --trials 3

One process each: the runner with one async worker thread (as `bench` runs it), max_in_flight 64 and a
prefetch of 128; the peer with 8 threads (prefetch 16 each). Both on the same 2 cores as the simulator
and RabbitMQ.
"""

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid

import pika

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
FIGLET = os.path.join(ROOT, "schemas", "examples", "submit-job.figlet.json")
WORKER = os.path.join(ROOT, "scripts", "peer", "worker.py")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_sim(binary, monitor):
    port = free_port()
    cmd = [binary, "sim", "--listen", f"127.0.0.1:{port}", "--clock-speed", "1", "--no-events"]
    if monitor:
        cmd += ["--default-run", "2s"]
        for i in range(1, 41):
            cmd += ["--node", f"bench-node-{i}:64:512Gi"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"{url}/version", timeout=1).read()
            return proc, url
        except OSError:
            time.sleep(0.1)
    proc.kill()
    sys.exit("the simulator did not start")


class Names:
    """Exchanges and queues of one trial, named after it."""

    def __init__(self, trial):
        p = f"peer-cmp.{trial}"
        self.jobs, self.submit, self.control = f"{p}.jobs", f"{p}.submit", f"{p}.control"
        self.sessions = f"{p}.sessions"
        self.dlx, self.dlq = f"{p}.dlx", f"{p}.dead"
        self.events, self.proxy, self.observer = f"{p}.events", f"{p}.proxy", f"{p}.observer"

    def runner_env(self, amqp):
        env = {
            "BROKER__URL": amqp, "BROKER__JOBS_EXCHANGE": self.jobs, "BROKER__SUBMIT_QUEUE": self.submit,
            "BROKER__CONTROL_QUEUE": self.control, "BROKER__SESSION_QUEUE": self.sessions,
            "BROKER__DEAD_LETTER_EXCHANGE": self.dlx, "BROKER__DEAD_LETTER_QUEUE": self.dlq,
            "BROKER__EVENTS_EXCHANGE": self.events, "BROKER__PROXY_EXCHANGE": self.proxy,
            "BROKER__SUBMIT_PREFETCH": "128", "RUNNER__MAX_IN_FLIGHT": "64",
            "OPS__LISTEN": "127.0.0.1:0", "OPS__LOG_FILTER": "warn",
        }
        return {f"VOLCANO_RUNNER_{k}": v for k, v in env.items()}

    def declare_for_peer(self, channel):
        """The topology the runner declares itself: a direct jobs exchange, a quorum submit queue."""
        channel.exchange_declare(self.jobs, "direct", durable=True)
        channel.exchange_declare(self.events, "topic", durable=True)
        channel.queue_declare(self.submit, durable=True, arguments={"x-queue-type": "quorum"})
        channel.queue_bind(self.submit, self.jobs, "submit")

    def delete(self, channel):
        for q in (self.submit, self.control, self.sessions, self.dlq, self.observer):
            channel.queue_delete(q)
        for x in (self.jobs, self.dlx, self.events, self.proxy):
            channel.exchange_delete(x)


def wait_for_consumer(channel_factory, queue, proc, deadline_s=60):
    deadline = time.time() + deadline_s
    while time.time() < deadline:
        if proc.poll() is not None:
            sys.exit(f"the contender exited with {proc.returncode} before consuming")
        conn, ch = channel_factory()
        try:
            if ch.queue_declare(queue, passive=True).method.consumer_count > 0:
                return
        except pika.exceptions.ChannelClosedByBroker:
            pass
        finally:
            if conn.is_open:
                conn.close()
        time.sleep(0.2)
    sys.exit(f"nothing consumed {queue} within {deadline_s} s")


def sustained(arrivals):
    """Events per second between the first and the last tenth of their arrivals, as `bench` measures:
    the start (connecting, the first lists) and the tail are left out."""
    n = len(arrivals)
    first, last = n // 10, n - 1 - n // 10
    if last <= first or arrivals[last] <= arrivals[first]:
        return 0.0
    return (last - first) / (arrivals[last] - arrivals[first])


def trial(args, contender, monitor, index, template):
    names = Names(f"{index}-{uuid.uuid4().hex[:6]}")
    sim, url = start_sim(args.bin, monitor)
    params = pika.URLParameters(args.amqp)

    def channel():
        conn = pika.BlockingConnection(params)
        return conn, conn.channel()

    conn, ch = channel()
    if contender == "runner":
        env = dict(os.environ, TOKIO_WORKER_THREADS="1", **names.runner_env(args.amqp))
        cmd = [args.bin, "run", "--cluster", url, "--id", f"cmp-{index}"]
        if not monitor:
            cmd.append("--no-monitor")
    else:
        names.declare_for_peer(ch)
        env = dict(os.environ)
        cmd = [sys.executable, WORKER, "--amqp", args.amqp, "--server", url, "--template", template,
               "--submit-queue", names.submit, "--events-exchange", names.events,
               "--threads", str(args.threads)]
        if monitor:
            cmd.append("--monitor")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_for_consumer(channel, names.submit, proc)
        ch.queue_declare(names.observer, durable=False, exclusive=False)
        ch.queue_bind(names.observer, names.events, "#")
        awaited = "SUCCESS" if monitor else "QUEUED"
        with open(FIGLET) as f:
            base = json.load(f)
        bodies = []
        for i in range(args.submissions):
            base["jobId"] = f"c{index}x{i}"
            bodies.append(json.dumps(base).encode())
        # Without waiting for each confirm (pika's blocking channel waits for one per message, which
        # would make the publisher the bottleneck): a local broker loses nothing, and a lost message
        # would show as an incomplete trial.
        started = time.monotonic()
        properties = pika.BasicProperties(
            content_type="application/json", type="volcano_runner.v1.SubmitJob", delivery_mode=2)
        for body in bodies:
            ch.basic_publish(names.jobs, "submit", body, properties)
        seen = {}
        deadline = started + args.timeout
        for method, props, body in ch.consume(names.observer, inactivity_timeout=1):
            if method is not None:
                ch.basic_ack(method.delivery_tag)
                if props.message_id and props.message_id.endswith("/" + awaited):
                    seen.setdefault(props.message_id, time.monotonic())
            if len(seen) >= args.submissions or time.monotonic() > deadline:
                break
        ch.cancel()
        return sustained(sorted(seen.values())), len(seen) >= args.submissions
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        sim.terminate()
        sim.wait()
        try:
            names.delete(ch)
        except pika.exceptions.AMQPError:
            pass
        if conn.is_open:
            conn.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bin", default=os.path.join(ROOT, "target", "release", "volcano-runner"))
    parser.add_argument("--amqp", default="amqp://guest:guest@127.0.0.1:5672/%2F")
    parser.add_argument("--submissions", type=int, default=2000)
    parser.add_argument("--trials", type=int, default=3)
    parser.add_argument("--threads", type=int, default=8, help="the peer's threads")
    parser.add_argument("--modes", default="off,on", help="monitoring off, on, or both (off,on)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per trial at most")
    args = parser.parse_args()

    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        rendered = subprocess.run([args.bin, "render", FIGLET, "-o", "json"], check=True,
                                  capture_output=True, text=True).stdout
        f.write(rendered)
        template = f.name

    results = {}
    index = 0
    for mode in args.modes.split(","):
        monitor = mode == "on"
        for t in range(args.trials):
            order = ["runner", "peer"] if t % 2 == 0 else ["peer", "runner"]
            for contender in order:
                index += 1
                rate, complete = trial(args, contender, monitor, index, template)
                results.setdefault((mode, contender), []).append(rate)
                print(f"monitor {mode:>3} | trial {t + 1} | {contender:>6} | {rate:8.1f} jobs/s"
                      f"{'' if complete else '  (incomplete)'}", flush=True)
    print()
    print(f"{args.submissions} figlet submissions per trial, {args.trials} trials per mode, medians:")
    for mode in args.modes.split(","):
        runner = statistics.median(results[(mode, "runner")])
        peer = statistics.median(results[(mode, "peer")])
        ratio = runner / peer if peer else float("inf")
        what = "QUEUED" if mode == "off" else "ends"
        print(f"monitor {mode:>3}: runner {runner:8.1f} {what}/s, peer {peer:8.1f} {what}/s, "
              f"runner/peer {ratio:.2f}x")
    os.unlink(template)


if __name__ == "__main__":
    main()
