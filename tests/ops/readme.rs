//! The commands the README and the docs print work as printed.
//!
//! - The README's "drive it by hand" lines are run, one after the other, in one `bash` as a reader pastes
//!   them (the only additions are the isolation a test needs: its own vhost, temporary directory and a free
//!   metrics port, given as `VOLCANO_RUNNER_*` variables and `TMPDIR`), and each has the effect it says.
//! - Every `volcano-runner ...` line in a code block of the README or docs/ parses: the subcommand and
//!   every flag exist and take what is given.

use crate::ops_common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use clap::Parser;
use volcano_runner::cli::Cli;

use ops_common::rabbit::TestVhost;
use ops_common::root;

/// The fenced code blocks of a Markdown text, each as its lines.
fn code_blocks(markdown: &str) -> Vec<Vec<String>> {
    let mut blocks = Vec::new();
    let mut current: Option<Vec<String>> = None;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            match current.take() {
                Some(block) => blocks.push(block),
                None => current = Some(Vec::new()),
            }
        } else if let Some(block) = current.as_mut() {
            block.push(line.to_owned());
        }
    }
    blocks
}

/// A command line split into words as a shell would (quotes, backslashes), up to the first unquoted
/// comment, background `&`, pipe, redirection or list operator.
fn shell_words(line: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word = String::new();
    let mut in_word = false;
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\'' => {
                in_word = true;
                for c in chars.by_ref() {
                    if c == '\'' {
                        break;
                    }
                    word.push(c);
                }
            }
            '"' => {
                in_word = true;
                while let Some(c) = chars.next() {
                    match c {
                        '"' => break,
                        '\\' => word.extend(chars.next()),
                        c => word.push(c),
                    }
                }
            }
            '\\' => {
                in_word = true;
                word.extend(chars.next());
            }
            '#' if !in_word => break,
            '&' | '|' | '>' | '<' | ';' => break,
            c if c.is_whitespace() => {
                if in_word {
                    words.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            c => {
                in_word = true;
                word.push(c);
            }
        }
    }
    if in_word {
        words.push(word);
    }
    words
}

/// Every `volcano-runner ...` command in the code blocks of a document (a `$ ` prompt is dropped; the
/// part after a pipe is another command).
fn commands_in(markdown: &str) -> Vec<String> {
    let mut commands = Vec::new();
    for block in code_blocks(markdown) {
        for line in block {
            for part in line.split(" | ") {
                let part = part.trim().trim_start_matches("$ ");
                if part.starts_with("volcano-runner ") {
                    commands.push(part.to_owned());
                }
            }
        }
    }
    commands
}

#[test]
fn every_documented_command_line_parses() {
    let mut documents = vec![root().join("README.md")];
    for entry in std::fs::read_dir(root().join("docs")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "md") {
            documents.push(path);
        }
    }
    let mut checked = 0;
    let mut wrong = Vec::new();
    for document in &documents {
        let text = std::fs::read_to_string(document).unwrap();
        for command in commands_in(&text) {
            let words = shell_words(&command);
            checked += 1;
            if let Err(e) = Cli::try_parse_from(&words) {
                wrong.push(format!(
                    "{}: `{command}`: {}",
                    document.strip_prefix(root()).unwrap().display(),
                    e.render().to_string().lines().next().unwrap_or_default()
                ));
            }
        }
    }
    assert!(
        checked >= 20,
        "only {checked} commands found: the extraction is broken"
    );
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
}

/// The extraction and the parse check can fail: a misspelt flag and an unknown subcommand are caught.
#[test]
fn the_parse_check_catches_a_wrong_command() {
    let text = "```sh\nvolcano-runner submit --formatt json x.json   # typo\nvolcano-runner admin stauts\n```\n";
    let commands = commands_in(text);
    assert_eq!(commands.len(), 2);
    for command in commands {
        assert!(
            Cli::try_parse_from(shell_words(&command)).is_err(),
            "{command}"
        );
    }
    assert_eq!(
        shell_words(r#"volcano-runner cancel 4817 --reason "changed my mind" &  # later"#),
        [
            "volcano-runner",
            "cancel",
            "4817",
            "--reason",
            "changed my mind"
        ]
    );
}

/// A `bash` reading lines from the test, with its output in files; its whole process group is killed on
/// drop.
struct Shell {
    child: Child,
    out: PathBuf,
    err: PathBuf,
    marks: usize,
}

impl Shell {
    fn start(dir: &Path, env: &[(String, String)]) -> Self {
        let out = dir.join("stdout");
        let err = dir.join("stderr");
        let mut command = Command::new("bash");
        command
            .current_dir(root())
            .stdin(Stdio::piped())
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(&err).unwrap())
            .envs(env.iter().map(|(k, v)| (k, v)));
        std::os::unix::process::CommandExt::process_group(&mut command, 0);
        let child = command.spawn().expect("bash starts");
        Self {
            child,
            out,
            err,
            marks: 0,
        }
    }

    fn send(&mut self, line: &str) {
        let stdin = self.child.stdin.as_mut().unwrap();
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    }

    fn stdout(&self) -> String {
        std::fs::read_to_string(&self.out).unwrap_or_default()
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.err).unwrap_or_default()
    }

    /// Runs `line` and returns its exit status once it has finished.
    fn run(&mut self, line: &str) -> i32 {
        self.marks += 1;
        let mark = format!("__readme_status_{}=", self.marks);
        self.send(line);
        self.send(&format!("echo \"{mark}$?\""));
        let found = self.wait_for(&format!("`{line}` to finish"), |out, _| out.contains(&mark));
        let rest = &found[found.find(&mark).unwrap() + mark.len()..];
        rest.lines().next().unwrap().trim().parse().unwrap()
    }

    /// Waits until `done(stdout, stderr)`; returns stdout then.
    fn wait_for(&self, what: &str, done: impl Fn(&str, &str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (out, err) = (self.stdout(), self.stderr());
            if done(&out, &err) {
                return out;
            }
            assert!(
                Instant::now() < deadline,
                "waited 60 s for {what}\n--- stdout\n{out}\n--- stderr\n{err}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Shell {
    fn drop(&mut self) {
        let group = format!("-{}", self.child.id());
        let _ = Command::new("kill").args(["-TERM", "--", &group]).status();
        let _ = self.child.wait();
    }
}

/// The event lines `events --follow` printed about job `id` in `state` (its text output: time, job id,
/// state, reason, status).
fn event_lines<'a>(out: &'a str, id: &str, state: &str) -> Vec<&'a str> {
    out.lines()
        .filter(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            words.get(1) == Some(&id) && words.get(2) == Some(&state)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_readme_drive_by_hand_lines_work_as_printed() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let block = code_blocks(&readme)
        .into_iter()
        .find(|b| {
            b.iter()
                .any(|l| l.starts_with("volcano-runner run --cluster sim &"))
        })
        .expect("the README's drive-it-by-hand block");
    let lines: Vec<String> = block
        .iter()
        .map(|l| l.trim().to_owned())
        .filter(|l| !l.is_empty())
        .collect();

    let vhost = TestVhost::new("readme").await;
    let dir = std::env::temp_dir().join(format!("volcano-runner-readme-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    // The binary this test run built, wherever the target directory is.
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_volcano-runner"))
        .parent()
        .unwrap()
        .to_owned();
    let env: Vec<(String, String)> = vec![
        ("VOLCANO_RUNNER_BROKER__URL".into(), vhost.amqp_url()),
        ("VOLCANO_RUNNER_OPS__LISTEN".into(), "127.0.0.1:0".into()),
        ("TMPDIR".into(), dir.display().to_string()),
        ("VOLCANO_RUNNER_LOG".into(), "warn".into()),
    ];
    let mut shell = Shell::start(&dir, &env);
    let admin_status = || {
        Command::new(bin_dir.join("volcano-runner"))
            .args(["admin", "--cluster", "sim", "status"])
            .current_dir(root())
            .envs(env.iter().map(|(k, v)| (k, v)))
            .output()
            .unwrap()
    };

    let mut seen = Vec::new();
    for line in &lines {
        let words = shell_words(line);
        let what = words.get(1).cloned().unwrap_or_default();
        if line.starts_with("export PATH=") {
            assert_eq!(shell.run(line), 0, "{line}");
            // Where this test's build put the binary, in case that is not ./target/debug.
            if bin_dir != root().join("target/debug") {
                shell.run(&format!("export PATH=\"{}:$PATH\"", bin_dir.display()));
            }
            assert_eq!(
                shell.run("command -v volcano-runner >/dev/null"),
                0,
                "volcano-runner is on the PATH after `{line}`"
            );
            seen.push("PATH".to_owned());
            continue;
        }
        assert_eq!(words[0], "volcano-runner", "an unexpected line: {line}");
        match what.as_str() {
            "run" => {
                shell.send(line);
                // Ready once the submit queue has its consumer (as the demo waits).
                let deadline = Instant::now() + Duration::from_secs(60);
                loop {
                    let out = admin_status();
                    let text = String::from_utf8_lossy(&out.stdout).into_owned();
                    let consumers = text
                        .lines()
                        .find(|l| l.split_whitespace().next() == Some("compute.jobs.submit"))
                        .and_then(|l| l.split_whitespace().nth(3))
                        .and_then(|n| n.parse::<u32>().ok());
                    if consumers == Some(1) {
                        break;
                    }
                    assert!(
                        Instant::now() < deadline,
                        "the runner did not start consuming: {text} {}\n{}",
                        String::from_utf8_lossy(&out.stderr),
                        shell.stderr()
                    );
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
            "events" => {
                shell.send(line);
                shell.wait_for("the event viewer to listen", |_, err| {
                    err.contains("listening on")
                });
            }
            "submit" => {
                assert_eq!(shell.run(line), 0, "{line}");
                shell.wait_for("QUEUED of 4817", |out, _| {
                    !event_lines(out, "4817", "QUEUED").is_empty()
                });
            }
            "extend" => {
                assert_eq!(shell.run(line), 0, "{line}");
                let out = shell.wait_for("the extension's answer", |out, _| {
                    event_lines(out, "4817", "STATUS")
                        .iter()
                        .any(|l| l.contains("extended"))
                });
                assert!(
                    event_lines(&out, "4817", "STATUS")
                        .iter()
                        .any(|l| l.contains("extended by 30 minutes")),
                    "the extension by 30 minutes is reported: {out}"
                );
            }
            "logs" => {
                shell.wait_for("RUNNING of 4817", |out, _| {
                    !event_lines(out, "4817", "RUNNING").is_empty()
                });
                let before = shell.stdout().len();
                assert_eq!(shell.run(line), 0, "{line}: {}", shell.stderr());
                let printed = shell.stdout()[before..].to_owned();
                assert!(
                    printed.contains("[rank 0] "),
                    "{line} printed the job's output: {printed} {}",
                    shell.stderr()
                );
            }
            "job" => {
                let before = shell.stdout().len();
                assert_eq!(shell.run(line), 0, "{line}: {}", shell.stderr());
                let printed = shell.stdout()[before..].to_owned();
                assert!(
                    printed.starts_with("Job:          4817 (")
                        && printed.contains("Owner:        alice")
                        && printed.contains("History:"),
                    "{line} printed the job's record: {printed}"
                );
            }
            "jobs" => {
                let before = shell.stdout().len();
                assert_eq!(shell.run(line), 0, "{line}: {}", shell.stderr());
                let printed = shell.stdout()[before..].to_owned();
                assert!(
                    printed.lines().any(|l| l.starts_with("4817 ")),
                    "{line} listed the job: {printed}"
                );
            }
            "cancel" => {
                assert_eq!(shell.run(line), 0, "{line}");
                let out = shell.wait_for("CANCELLED of 4817", |out, _| {
                    !event_lines(out, "4817", "CANCELLED").is_empty()
                });
                assert!(
                    event_lines(&out, "4817", "CANCELLED")[0].contains("changed my mind"),
                    "the reason is in the event: {out}"
                );
            }
            "admin" => {
                let before = shell.stdout().len();
                assert_eq!(shell.run(line), 0, "{line}: {}", shell.stderr());
                let printed = shell.stdout()[before..].to_owned();
                if words.contains(&"queue".to_owned()) {
                    // Nothing waits on the simulator's empty nodes: the figlet job has run.
                    assert!(
                        printed.contains("no job is waiting to start")
                            || printed.contains("ESTIMATED START"),
                        "{line} printed the waiting jobs: {printed}"
                    );
                    seen.push("admin queue".into());
                    continue;
                }
                assert!(
                    printed.contains("compute.jobs.submit") && printed.contains("submissions flow"),
                    "{line} printed the status: {printed}"
                );
            }
            other => panic!("a README line this test does not know: {other}: {line}"),
        }
        seen.push(what);
    }
    assert_eq!(
        seen,
        [
            "PATH",
            "run",
            "events",
            "submit",
            "extend",
            "logs",
            "job",
            "jobs",
            "cancel",
            "admin",
            "admin queue"
        ],
        "every line of the block ran"
    );
    drop(shell);
    let _ = std::fs::remove_dir_all(&dir);
}

/// The README's simulator lines, pasted as printed: the simulator on 127.0.0.1:6443, then kubectl lists,
/// applies a rendered job and sees its pods. (kubectl reads an empty kubeconfig, so the reader's own
/// clusters stay out of it.)
#[test]
fn the_readme_simulator_lines_work_as_printed() {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let block = code_blocks(&readme)
        .into_iter()
        .find(|b| {
            b.iter()
                .any(|l| l.starts_with("volcano-runner sim --listen"))
        })
        .expect("the README's simulator block");
    let dir =
        std::env::temp_dir().join(format!("volcano-runner-readme-sim-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(&kubeconfig, "apiVersion: v1\nkind: Config\nclusters: []\n").unwrap();
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_volcano-runner"))
        .parent()
        .unwrap()
        .to_owned();
    let path = format!(
        "{}:{}",
        bin_dir.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let env = vec![
        ("PATH".to_owned(), path),
        ("KUBECONFIG".to_owned(), kubeconfig.display().to_string()),
        ("VOLCANO_RUNNER_LOG".to_owned(), "warn".to_owned()),
    ];
    let mut shell = Shell::start(&dir, &env);
    let mut ran = 0;
    for line in block.iter().map(|l| l.trim()).filter(|l| !l.is_empty()) {
        if line.ends_with('&') {
            shell.send(line);
            shell.wait_for("the simulator to listen", |out, _| {
                out.contains("http://127.0.0.1:6443")
            });
        } else {
            let status = shell.run(line);
            assert_eq!(status, 0, "`{line}` failed: {}", shell.stderr());
        }
        ran += 1;
    }
    assert_eq!(ran, 5, "every line ran");
    let out = shell.stdout();
    for expected in [
        "sim-node-1",
        "default",
        "job.batch.volcano.sh/j-4818 created",
        "j-4818",
        "j-4818-job-0",
        "j-4818-job-1",
    ] {
        assert!(out.contains(expected), "{expected} is printed: {out}");
    }
    drop(shell);
    let _ = std::fs::remove_dir_all(&dir);
}

/// docs/ops.md's maintenance example cancels the window its `schedule` line creates: the id in the
/// `cancel` line is the one `schedule` prints for that window (its start and a hash of start, end and
/// nodes), worked out here as the command does, at an instant before the window.
#[test]
fn the_maintenance_example_cancels_the_window_it_schedules() {
    use volcano_runner::cluster::Window;
    use volcano_runner::cluster::maintenance::parse_time;
    let ops = std::fs::read_to_string(root().join("docs/ops.md")).unwrap();
    let commands = commands_in(&ops);
    let words = |prefix: &str| -> Vec<Vec<String>> {
        commands
            .iter()
            .filter(|c| c.starts_with(prefix))
            .map(|c| shell_words(c))
            .collect()
    };
    let flag = |words: &[String], name: &str| -> Option<String> {
        let at = words.iter().position(|w| w == name)?;
        words.get(at + 1).cloned()
    };
    // The scheduled windows with an absolute start (a relative one has no fixed id).
    let now: jiff::Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
    let ids: Vec<String> = words("volcano-runner admin maintenance schedule")
        .iter()
        .filter_map(|w| {
            let start = flag(w, "--start")?;
            let end = flag(w, "--end")?;
            if start.starts_with('+') || start == "now" {
                return None;
            }
            let nodes = flag(w, "--nodes")
                .map(|n| n.split(',').map(str::to_owned).collect())
                .unwrap_or_default();
            let window = Window::new(
                parse_time("--start", &start, now).unwrap(),
                parse_time("--end", &end, now).unwrap(),
                nodes,
                None,
                "docs",
                now,
            )
            .unwrap();
            Some(window.id)
        })
        .collect();
    assert!(!ids.is_empty(), "an absolute schedule line in docs/ops.md");
    let cancels = words("volcano-runner admin maintenance cancel");
    assert!(!cancels.is_empty(), "a cancel line in docs/ops.md");
    for cancel in cancels {
        let id = &cancel[4];
        assert!(
            ids.contains(id),
            "docs/ops.md cancels {id}, which none of its schedule lines creates (they create {ids:?})"
        );
    }
}
