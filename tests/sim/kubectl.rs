//! kubectl against `volcano-runner sim`: the binary is started as a reader would start it, and kubectl
//! lists, creates, applies and deletes through it. kubectl is required (`scripts/test` installs it when it
//! is missing), so this runs on every machine.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `volcano-runner sim` child process, killed on drop.
struct SimProcess {
    child: Child,
    /// Kept open so that the simulator can go on writing to its stdout.
    _stdout: BufReader<std::process::ChildStdout>,
    url: String,
    kubeconfig: std::path::PathBuf,
}

impl Drop for SimProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_file(&self.kubeconfig);
    }
}

fn require_kubectl() {
    let status = Command::new("kubectl")
        .arg("version")
        .arg("--client")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    assert!(
        status.is_ok_and(|s| s.success()),
        "kubectl cannot be run: this test needs it; scripts/test installs it (apt-get install kubernetes-client)"
    );
}

fn start_sim(extra: &[&str]) -> SimProcess {
    let mut child = Command::new(env!("CARGO_BIN_EXE_volcano-runner"))
        .args(["sim", "--listen", "127.0.0.1:0"])
        .args(extra)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("volcano-runner sim starts");
    let stdout = child.stdout.take().unwrap();
    let mut line = String::new();
    let mut reader = BufReader::new(stdout);
    reader.read_line(&mut line).expect("a first line");
    let url = line
        .split_whitespace()
        .find(|w| w.starts_with("http://"))
        .expect("the URL in the first line")
        .to_string();
    // An empty kubeconfig keeps the user's own clusters out of the test.
    let kubeconfig = std::env::temp_dir().join(format!("sim-kubeconfig-{}", child.id()));
    std::fs::write(
        &kubeconfig,
        "apiVersion: v1\nkind: Config\nclusters: []\ncontexts: []\nusers: []\n",
    )
    .unwrap();
    SimProcess {
        child,
        _stdout: reader,
        url,
        kubeconfig,
    }
}

impl SimProcess {
    fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> (bool, String, String) {
        let mut cmd = Command::new("kubectl");
        cmd.env("KUBECONFIG", &self.kubeconfig)
            .arg("--server")
            .arg(&self.url)
            .args(args);
        cmd.stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        let mut child = cmd.spawn().expect("kubectl runs");
        if let Some(input) = stdin {
            use std::io::Write;
            child
                .stdin
                .take()
                .unwrap()
                .write_all(input.as_bytes())
                .unwrap();
        }
        let out = child.wait_with_output().unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    }

    fn ok(&self, args: &[&str]) -> String {
        let (ok, out, err) = self.kubectl(args, None);
        assert!(ok, "kubectl {args:?} failed: {err}");
        out
    }
}

const JOB_YAML: &str = r#"
apiVersion: v1
kind: Namespace
metadata:
  name: app-kubernetes
---
apiVersion: batch.volcano.sh/v1alpha1
kind: Job
metadata:
  name: j-42
  namespace: app-kubernetes
  annotations:
    ucloud.dk/user: alice
spec:
  minAvailable: 1
  queue: default
  plugins: {env: [], svc: []}
  tasks:
  - name: job
    replicas: 1
    template:
      spec:
        restartPolicy: Never
        containers:
        - name: user-job
          image: ubuntu:22.04
          command: ["/bin/bash", "-c", "echo hello from kubectl; sleep 30"]
          resources:
            requests: {cpu: "2", memory: 4Gi}
            limits: {cpu: "2", memory: 4Gi}
"#;

#[test]
fn kubectl_lists_creates_applies_and_deletes() {
    require_kubectl();
    let sim = start_sim(&["--clock-speed", "0"]);
    let nodes = sim.ok(&["get", "nodes"]);
    assert_eq!(
        nodes.lines().filter(|l| l.starts_with("sim-")).count(),
        5,
        "{nodes}"
    );
    assert!(sim.ok(&["get", "queues"]).contains("default"));
    assert!(sim.ok(&["api-resources"]).contains("vcjob"));

    let (ok, out, err) = sim.kubectl(&["apply", "-f", "-"], Some(JOB_YAML));
    assert!(ok, "{err}");
    assert!(out.contains("namespace/app-kubernetes created"), "{out}");
    assert!(out.contains("job.batch.volcano.sh/j-42 created"), "{out}");
    let jobs = sim.ok(&["get", "vcjob", "-A"]);
    let row = jobs
        .lines()
        .find(|l| l.contains("j-42"))
        .expect("j-42 listed");
    assert!(row.starts_with("app-kubernetes"), "{jobs}");
    assert!(row.contains("Pending"), "{jobs}");
    let header = jobs.lines().next().unwrap();
    assert!(
        header.contains("STATUS") && header.contains("MINAVAILABLE"),
        "{header}"
    );

    let pods = sim.ok(&["get", "pods", "-n", "app-kubernetes", "-o", "wide"]);
    assert!(pods.lines().next().unwrap().contains("NODE"), "{pods}");
    let pod = pods
        .lines()
        .find(|l| l.starts_with("j-42-job-0"))
        .expect("the job's pod");
    assert!(
        pod.contains("ContainerCreating") && pod.contains("sim-"),
        "{pods}"
    );
    assert!(
        sim.ok(&["get", "pg", "-n", "app-kubernetes"])
            .contains("Running")
    );
    let cm = sim.ok(&[
        "get",
        "configmap",
        "j-42-svc",
        "-n",
        "app-kubernetes",
        "-o",
        "jsonpath={.data.VC_JOB_NUM}",
    ]);
    assert_eq!(cm, "1");

    // Applying again changes nothing the server cares about; applying a change patches it.
    let (ok, _, err) = sim.kubectl(&["apply", "-f", "-"], Some(JOB_YAML));
    assert!(ok, "{err}");
    let annotated = JOB_YAML.replace("ucloud.dk/user: alice", "ucloud.dk/user: bob");
    let (ok, out, err) = sim.kubectl(&["apply", "-f", "-"], Some(&annotated));
    assert!(ok, "{err}");
    assert!(
        out.contains("job.batch.volcano.sh/j-42 configured"),
        "{out}"
    );
    assert_eq!(
        sim.ok(&[
            "get",
            "vcjob",
            "j-42",
            "-n",
            "app-kubernetes",
            "-o",
            "jsonpath={.metadata.annotations.ucloud\\.dk/user}"
        ]),
        "bob"
    );

    // The CRD's validation message reaches kubectl.
    let broken = JOB_YAML
        .split("---")
        .nth(1)
        .unwrap()
        .replace("name: j-42", "name: j-43")
        .replace("replicas: 1", "replicas: one");
    let (ok, _, err) = sim.kubectl(&["create", "-f", "-"], Some(&broken));
    assert!(!ok);
    assert!(
        err.contains("spec.tasks[0].replicas in body must be of type integer"),
        "{err}"
    );

    let out = sim.ok(&["delete", "vcjob", "j-42", "-n", "app-kubernetes"]);
    assert!(out.contains("deleted"), "{out}");
    assert!(!sim.ok(&["get", "vcjob", "-A"]).contains("j-42"));
}

#[test]
fn kubectl_sees_a_job_complete_on_a_fast_clock() {
    require_kubectl();
    // 200 simulated seconds per real second: the 30 s job takes about 0.15 s.
    let sim = start_sim(&["--clock-speed", "200"]);
    let (ok, _, err) = sim.kubectl(&["apply", "-f", "-"], Some(JOB_YAML));
    assert!(ok, "{err}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let phase = sim.ok(&[
            "get",
            "vcjob",
            "j-42",
            "-n",
            "app-kubernetes",
            "-o",
            "jsonpath={.status.state.phase}",
        ]);
        if phase == "Completed" {
            break;
        }
        assert!(Instant::now() < deadline, "still {phase}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let pods = sim.ok(&["get", "pods", "-n", "app-kubernetes", "-o", "wide"]);
    let pod = pods.lines().find(|l| l.starts_with("j-42-job-0")).unwrap();
    assert!(
        pod.contains("Completed") && pod.contains("10.244."),
        "{pods}"
    );
    assert_eq!(
        sim.ok(&["logs", "j-42-job-0", "-n", "app-kubernetes"]),
        "hello from kubectl\n"
    );
    let events = sim.ok(&["get", "events", "-n", "app-kubernetes"]);
    assert!(
        events.contains("Scheduled") && events.contains("Started"),
        "{events}"
    );
}

/// A job ended by Volcano's TerminateJob command (as `vcctl` would issue it) is listed by
/// `kubectl get vcjob` as `Terminated`, not as a deletion in progress, with its pods gone and the
/// Command taken.
#[test]
fn kubectl_sees_a_terminated_job_as_terminated() {
    require_kubectl();
    let sim = start_sim(&["--clock-speed", "20"]);
    let long = JOB_YAML.replace("sleep 30", "sleep infinity");
    let (ok, _, err) = sim.kubectl(&["apply", "-f", "-"], Some(&long));
    assert!(ok, "{err}");
    let field = |path: &str| {
        sim.ok(&[
            "get",
            "vcjob",
            "j-42",
            "-n",
            "app-kubernetes",
            "-o",
            &format!("jsonpath={path}"),
        ])
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while field("{.status.state.phase}") != "Running" {
        assert!(Instant::now() < deadline, "never Running");
        std::thread::sleep(Duration::from_millis(100));
    }
    let uid = field("{.metadata.uid}");
    let command = format!(
        "apiVersion: bus.volcano.sh/v1alpha1\nkind: Command\nmetadata:\n  name: j-42-terminate\n  \
         namespace: app-kubernetes\naction: TerminateJob\ntarget:\n  apiVersion: \
         batch.volcano.sh/v1alpha1\n  kind: Job\n  name: j-42\n  uid: {uid}\n"
    );
    let (ok, out, err) = sim.kubectl(&["create", "-f", "-"], Some(&command));
    assert!(ok, "{err}");
    assert!(
        out.contains("command.bus.volcano.sh/j-42-terminate created"),
        "{out}"
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let jobs = sim.ok(&["get", "vcjob", "-A"]);
        let row = jobs
            .lines()
            .find(|l| l.contains("j-42"))
            .expect("j-42 listed");
        if row.contains("Terminated") {
            break;
        }
        assert!(Instant::now() < deadline, "still {row}");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(field("{.metadata.deletionTimestamp}"), "");
    assert!(
        !sim.ok(&["get", "pods", "-n", "app-kubernetes"])
            .contains("j-42-job-0"),
        "the pod is gone"
    );
    assert!(
        !sim.ok(&["get", "commands", "-A"])
            .contains("j-42-terminate")
    );
}
