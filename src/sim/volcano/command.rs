//! How a simulated container behaves, read from its command by a small rule set, so that tests decide
//! run time, exit code and output from the job they submit:
//!
//! - `sleep N` (seconds, or with an `s`/`m`/`h`/`d` suffix, or `infinity`) runs N simulated seconds;
//!   several sleeps add up, and other commands around them take no time (`train && sleep 30` runs 30 s);
//! - `exit N` stops with exit code N, `false` with 1, `true` and `:` do nothing;
//! - `echo ...` and `printf ...` print their arguments to the log;
//! - anything else prints `[sim] <command>` and, when the script has no `sleep`, makes the container run
//!   for the configured default time (init containers, which are set-up steps, take no time);
//! - `sh -c SCRIPT` (also bash, ash, dash, zsh) is split into statements on newlines, `;`, `&&` and `||`.

use std::time::Duration;

/// What a container will do once started.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerPlan {
    /// How long it runs; `None` runs until killed (`sleep infinity`).
    pub duration: Option<Duration>,
    pub exit_code: i32,
    /// Log lines with their offset from the container's start.
    pub lines: Vec<(Duration, String)>,
}

const SHELLS: &[&str] = &["sh", "bash", "ash", "dash", "zsh"];

/// Splits a shell script into statements on newlines, `;`, `&&` and `||`, outside quotes.
fn statements(script: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quote: Option<char> = None;
    let chars: Vec<char> = script.chars().collect();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        match quote {
            Some(q) => {
                if c == q {
                    quote = None;
                }
                cur.push(c);
            }
            None => match c {
                '\'' | '"' => {
                    quote = Some(c);
                    cur.push(c);
                }
                '\n' | ';' => out.push(std::mem::take(&mut cur)),
                '&' | '|' if chars.get(i + 1) == Some(&c) => {
                    out.push(std::mem::take(&mut cur));
                    i += 1;
                }
                _ => cur.push(c),
            },
        }
        i += 1;
    }
    out.push(cur);
    out.into_iter()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty() && !s.starts_with('#'))
        .collect()
}

/// Splits a statement into words with single and double quotes.
fn words(statement: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut quote: Option<char> = None;
    let mut has = false;
    for c in statement.chars() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => cur.push(c),
            None => match c {
                '\'' | '"' => {
                    quote = Some(c);
                    has = true;
                }
                c if c.is_whitespace() => {
                    if has || !cur.is_empty() {
                        out.push(std::mem::take(&mut cur));
                        has = false;
                    }
                }
                c => cur.push(c),
            },
        }
    }
    if has || !cur.is_empty() {
        out.push(cur);
    }
    out
}

/// `sleep` arguments: `10`, `1.5`, `2m`, `1h`, `infinity`. `None` inside means forever.
fn sleep_duration(arg: &str) -> Option<Option<Duration>> {
    if arg == "infinity" || arg == "inf" {
        return Some(None);
    }
    let (num, mult) = match arg.chars().last()? {
        's' => (&arg[..arg.len() - 1], 1.0),
        'm' => (&arg[..arg.len() - 1], 60.0),
        'h' => (&arg[..arg.len() - 1], 3600.0),
        'd' => (&arg[..arg.len() - 1], 86400.0),
        _ => (arg, 1.0),
    };
    let secs: f64 = num.parse().ok()?;
    if !secs.is_finite() || secs < 0.0 {
        return None;
    }
    // Longer than a Duration holds (`sleep 1e300`): as good as forever, never a panic.
    Some(Duration::try_from_secs_f64(secs * mult).ok())
}

fn basename(s: &str) -> &str {
    s.rsplit('/').next().unwrap_or(s)
}

/// Works out a container's plan from its `command` and `args` (`image` names the default entrypoint).
pub fn plan(
    command: &[String],
    args: &[String],
    image: &str,
    default_run: Duration,
) -> ContainerPlan {
    let argv: Vec<String> = command.iter().chain(args).cloned().collect();
    // The output wrapper (pipeline::plugins::output_files) runs the application's argv.
    if let Some(wrapped) = crate::pipeline::plugins::output_files::unwrap(&argv) {
        return plan(wrapped.argv, &[], image, default_run);
    }
    // A traced job's gate (pipeline::plugins::traced) runs the application's argv; its tracer runs
    // until the pod's other containers have ended (the kubelet ends it then).
    if let Some(argv) = crate::pipeline::plugins::traced::ungate(&argv) {
        return plan(argv, &[], image, default_run);
    }
    if crate::pipeline::plugins::traced::is_tracer(&argv) {
        return ContainerPlan {
            duration: None,
            exit_code: 0,
            lines: Vec::new(),
        };
    }
    let mut run = Run {
        saw_unknown: argv.is_empty(),
        ..Run::default()
    };
    if argv.is_empty() {
        run.lines
            .push((Duration::ZERO, format!("[sim] {image} (image entrypoint)")));
    }
    for stmt in script_statements(&argv) {
        if !run.statement(command_words(&stmt)) {
            break;
        }
    }
    let duration = if run.forever {
        None
    } else if !run.saw_sleep && run.saw_unknown && run.exit_code == 0 {
        Some(run.elapsed.saturating_add(default_run))
    } else {
        Some(run.elapsed)
    };
    ContainerPlan {
        duration,
        exit_code: run.exit_code,
        lines: run.lines,
    }
}

/// The statements a container runs, each as words: a shell's `-c` script split up, else the argv itself.
fn script_statements(argv: &[String]) -> Vec<Vec<String>> {
    match argv.first() {
        None => Vec::new(),
        Some(first) if SHELLS.contains(&basename(first)) => {
            let script = argv
                .iter()
                .skip(1)
                .position(|a| {
                    a == "-c" || (a.starts_with('-') && a.ends_with('c') && !a.starts_with("--"))
                })
                .and_then(|i| argv.get(i + 2));
            match script {
                Some(s) => statements(s).iter().map(|s| words(s)).collect(),
                None => vec![argv.to_vec()],
            }
        }
        Some(_) => vec![argv.to_vec()],
    }
}

/// A statement's words from the command on: leading variable assignments and `exec` do not change what
/// runs.
fn command_words(stmt: &[String]) -> &[String] {
    let mut w = stmt;
    while let Some(first) = w.first() {
        if first == "exec"
            || (first.contains('=') && !first.starts_with('=') && !first.starts_with('-'))
        {
            w = &w[1..];
        } else {
            break;
        }
    }
    w
}

/// What the statements run so far have shown: time taken, output, and how the container ends.
#[derive(Default)]
struct Run {
    elapsed: Duration,
    forever: bool,
    saw_sleep: bool,
    saw_unknown: bool,
    exit_code: i32,
    lines: Vec<(Duration, String)>,
}

impl Run {
    /// Runs one statement (its words from the command on); false when the script stops there (`exit`,
    /// `false`, an endless or invalid `sleep`).
    fn statement(&mut self, w: &[String]) -> bool {
        let Some(cmd) = w.first() else {
            return true;
        };
        match basename(cmd) {
            "sleep" => {
                self.saw_sleep = true;
                match w.get(1).and_then(|a| sleep_duration(a)) {
                    Some(Some(d)) => self.elapsed = self.elapsed.saturating_add(d),
                    Some(None) => {
                        self.forever = true;
                        return false;
                    }
                    None => {
                        self.lines.push((
                            self.elapsed,
                            format!(
                                "sleep: invalid time interval '{}'",
                                w.get(1).map_or("", |s| s)
                            ),
                        ));
                        self.exit_code = 1;
                        return false;
                    }
                }
            }
            "exit" => {
                self.exit_code = w
                    .get(1)
                    .and_then(|c| c.parse::<i32>().ok())
                    .map_or(0, |c| c & 0xff);
                return false;
            }
            "false" => {
                self.exit_code = 1;
                return false;
            }
            "true" | ":" | "set" | "cd" | "export" => {}
            "echo" | "printf" => {
                let text: Vec<&str> = w[1..]
                    .iter()
                    .map(String::as_str)
                    .skip_while(|a| matches!(*a, "-n" | "-e" | "-E"))
                    .collect();
                self.lines.push((
                    self.elapsed,
                    text.join(" ").replace("\\n", "").trim_end().to_string(),
                ));
            }
            _ => {
                self.saw_unknown = true;
                self.lines
                    .push((self.elapsed, format!("[sim] {}", w.join(" "))));
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sleep_too_long_for_a_duration_is_forever() {
        assert_eq!(sleep_duration("1e300"), Some(None));
        assert_eq!(sleep_duration("1e17d"), Some(None));
        assert_eq!(sleep_duration("90m"), Some(Some(Duration::from_secs(5400))));
    }

    fn sv(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    const DEFAULT: Duration = Duration::from_secs(60);

    #[test]
    fn sleep_runs_that_long() {
        let p = plan(&sv(&["sleep", "30"]), &[], "img", DEFAULT);
        assert_eq!(p.duration, Some(Duration::from_secs(30)));
        assert_eq!(p.exit_code, 0);
        let p = plan(
            &sv(&["/bin/sh", "-c", "python train.py && sleep 2m"]),
            &[],
            "img",
            DEFAULT,
        );
        assert_eq!(p.duration, Some(Duration::from_secs(120)));
        assert_eq!(
            p.lines,
            vec![(Duration::ZERO, "[sim] python train.py".to_string())]
        );
        let p = plan(&sv(&["sleep"]), &sv(&["infinity"]), "img", DEFAULT);
        assert_eq!(p.duration, None);
    }

    /// Sleeps longer than a Duration holds, alone or added up, are as good as forever: never a panic
    /// of the simulator that runs the pod.
    #[test]
    fn huge_sleeps_do_not_overflow() {
        let p = plan(&sv(&["sleep", "1e300"]), &[], "img", DEFAULT);
        assert_eq!(p.duration, None);
        let p = plan(
            &sv(&["sh", "-c", "sleep 1e19; sleep 1e19; echo late"]),
            &[],
            "img",
            DEFAULT,
        );
        assert_eq!(p.duration, Some(Duration::MAX));
    }

    #[test]
    fn exit_and_false_set_the_exit_code() {
        let p = plan(
            &sv(&["sh", "-c", "echo start; sleep 5; exit 3; echo never"]),
            &[],
            "img",
            DEFAULT,
        );
        assert_eq!(p.exit_code, 3);
        assert_eq!(p.duration, Some(Duration::from_secs(5)));
        assert_eq!(p.lines, vec![(Duration::ZERO, "start".to_string())]);
        let p = plan(&sv(&["false"]), &[], "img", DEFAULT);
        assert_eq!(p.exit_code, 1);
        assert_eq!(p.duration, Some(Duration::ZERO));
    }

    #[test]
    fn unknown_commands_run_the_default_time() {
        let p = plan(
            &sv(&["/opt/app/run", "--threads", "4"]),
            &[],
            "img",
            DEFAULT,
        );
        assert_eq!(p.duration, Some(DEFAULT));
        assert_eq!(p.exit_code, 0);
        assert_eq!(
            p.lines,
            vec![(Duration::ZERO, "[sim] /opt/app/run --threads 4".to_string())]
        );
        let p = plan(&[], &[], "alpine:3", DEFAULT);
        assert_eq!(p.duration, Some(DEFAULT));
        assert_eq!(p.lines[0].1, "[sim] alpine:3 (image entrypoint)");
    }

    #[test]
    fn echo_lines_carry_their_offsets_and_quotes() {
        let p = plan(
            &sv(&["bash", "-lc", "echo 'a b'; sleep 1.5\necho \"c\""]),
            &[],
            "img",
            DEFAULT,
        );
        assert_eq!(
            p.lines,
            vec![
                (Duration::ZERO, "a b".to_string()),
                (Duration::from_millis(1500), "c".to_string())
            ]
        );
        assert_eq!(p.duration, Some(Duration::from_millis(1500)));
    }

    #[test]
    fn assignments_and_exec_are_skipped() {
        let p = plan(
            &sv(&["sh", "-c", "FOO=1 exec sleep 7"]),
            &[],
            "img",
            DEFAULT,
        );
        assert_eq!(p.duration, Some(Duration::from_secs(7)));
    }
}
