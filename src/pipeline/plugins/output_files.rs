//! Output files: every rank's output is kept in the job's output folder, `stdout.txt` for rank 0 and
//! `stdout-<rank>.txt` for the others (UCloud's names), written by the job itself as it runs.
//!
//! Called by FileMount when the job has an output folder and `[pipeline.output] enabled` (the default).
//!
//! - An init container (`[pipeline.output] helper_image`, a statically linked busybox at `/bin/busybox`)
//!   copies busybox into an `emptyDir` mounted at [`HELPER_DIR`]; the user's container then runs
//!   `<HELPER_DIR>/busybox sh -c <WRAPPER> volcano-runner-output <busybox> /work <max_bytes> <argv...>`.
//!   Nothing of the image is used, so images without bash, without `sh` and without coreutils work.
//! - The wrapper starts the application with its stdout and stderr into a FIFO, copies that stream both to
//!   the container's own log (so `kubectl logs`, `volcano-runner logs` and the event tails still see
//!   everything) and to the file, keeping the first `max_bytes` bytes and appending a marker line when it
//!   cut ([`KEPT`]'s marker). The copy is unbuffered (busybox `tee` and `dd`, each read written at once), so
//!   the file holds what the application wrote even when the container is killed (SIGKILL after the grace
//!   period); the marker is written at the moment of the cut.
//! - It forwards SIGTERM, SIGINT and SIGHUP to the application, waits for it, waits for the copy to drain,
//!   and exits with the application's exit code (128 + the signal's number when a signal ended it, as the
//!   container runtime reports it). A failure stays a failure; a SIGTERM reaches the application.
//! - The job ends when the application ends, whatever it left in the background (`jupyter ... &`,
//!   `tail -f ... &`): such a process holds the output's pipe open, so the copy would never see its end
//!   and the job would run (and be charged) until that process ended. The copy is given
//!   [`DRAIN_SECONDS`] to take in what is still in the pipe, then stopped; the file then holds all the
//!   application wrote (output the left-behind process writes later is not kept), and the container's
//!   end stops that process as it stops any.
//! - If the FIFO or the file cannot be created (a read-only output folder), the application runs as if
//!   unwrapped, with a line on stderr saying why.
//! - Each attempt of a restarted job (node loss, eviction) starts the files anew.
//!
//! Why the job writes the files and not the monitor after the end (UCloud's way, W15): the monitor reads
//! logs through the API, which has nothing once the pods are gone, so an expiry, a cancel or a runner
//! killed at that moment lost the output. Written as the job runs, the files are complete whatever
//! happens to the runners. docs/pipeline.md says more.

use serde::Deserialize;
use std::collections::BTreeMap;

use crate::messages::v1::KeptOutput;
use crate::pipeline::PipelineError;
use crate::pipeline::context::Context;
use crate::pipeline::draft::{Draft, Helper};
use crate::pipeline::kept::PerRank;
use crate::pipeline::mounts::WORK;

/// `[pipeline.output]`: the output files.
#[derive(Debug, Clone, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields, default)]
pub struct OutputConfig {
    /// Keep every rank's output in the job's output folder. Off: the output lives only in the pods'
    /// logs, and goes with them.
    pub enabled: bool,
    /// The first this many bytes of each rank's output are kept; a marker line says where it was cut.
    pub max_bytes: u64,
    /// The image the init container copies busybox from: a statically linked busybox at
    /// `/bin/busybox`, pinned by tag or digest.
    pub helper_image: String,
    /// The uid the init container runs as (non-root).
    pub helper_run_as_user: i64,
}

impl Default for OutputConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            max_bytes: 64 * 1024 * 1024,
            helper_image: "docker.io/library/busybox:1.36.1".into(),
            helper_run_as_user: 65534,
        }
    }
}

/// The init container that copies busybox.
pub const INIT_CONTAINER: &str = "volcano-runner-output";
/// The `emptyDir` that holds busybox and the FIFOs.
pub const VOLUME: &str = "volcano-runner-output";
/// Where the user's container sees that volume.
pub const HELPER_DIR: &str = "/.volcano-runner";
/// `$0` of the wrapper: how the simulator (and a reader of the pod spec) recognises it.
pub const WRAPPER_NAME: &str = "volcano-runner-output";

/// The output files: recorded in the annotations `outputFolder` and `outputMaxBytes` (under the prefix),
/// cut with the marker `[volcano-runner: output cut here: ...]`.
pub const KEPT: PerRank = PerRank {
    what: "output",
    folder_annotation: "outputFolder",
    max_bytes_annotation: "outputMaxBytes",
    file_name,
};

/// The wrapper, POSIX sh run by busybox. `$1` busybox (its folder holds the FIFOs), `$2` the folder,
/// `$3` the bound, the rest the application's argv. It holds neither `$(` nor `$$`: Kubernetes expands
/// `$(VAR)` in a container's command and turns `$$` into `$`, so the script reaches the shell as written. Every tool is busybox's (`"$b" tee`), so the image needs none of them.
pub const WRAPPER: &str = r#"b=$1 dir=$2 max=$3
shift 3
r=${VC_TASK_INDEX:-0}
if [ "$r" = 0 ]; then f=$dir/stdout.txt; else f=$dir/stdout-$r.txt; fi
h=${b%/*}
p=$h/out q=$h/file
if ! "$b" mkfifo "$p" "$q" 2>/dev/null || ! (: >"$f") 2>/dev/null; then
  echo "volcano-runner: the output cannot be kept in $f; the application runs without a copy" >&2
  "$b" rm -f "$p" "$q"
  exec "$@"
fi
{
  "$b" dd bs=65536 count="$max" iflag=count_bytes 2>/dev/null
  if [ "`"$b" dd bs=1 count=1 2>/dev/null | "$b" wc -c`" -gt 0 ]; then
    printf '\n[volcano-runner: output cut here: only the first %s bytes of this rank'"'"'s output are kept]\n' "$max"
    "$b" cat >/dev/null
  fi
} <"$q" >"$f" &
w=$!
"$b" tee "$q" <"$p" &
t=$!
exec 4<&0
"$@" <&4 4<&- >"$p" 2>&1 &
a=$!
exec 4<&-
trap 'kill -TERM "$a" 2>/dev/null' TERM
trap 'kill -INT "$a" 2>/dev/null' INT
trap 'kill -HUP "$a" 2>/dev/null' HUP
wait "$a"
code=$?
while kill -0 "$a" 2>/dev/null; do
  wait "$a"
  code=$?
done
( "$b" sleep 2; kill "$t" ) </dev/null >/dev/null 2>&1 &
k=$!
wait "$t" 2>/dev/null
kill "$k" 2>/dev/null
wait "$k" 2>/dev/null
wait "$w"
"$b" rm -f "$p" "$q"
exit "$code"
"#;

/// How long the copy may still drain the pipe once the application has ended while something it left
/// behind holds the pipe open (the `sleep 2` of [`WRAPPER`]). Without one, it ends at once.
pub const DRAIN_SECONDS: u32 = 2;

/// A rank's file name: `stdout.txt` for rank 0, `stdout-<rank>.txt` for the others.
pub fn file_name(rank: u32) -> String {
    if rank == 0 {
        "stdout.txt".to_owned()
    } else {
        format!("stdout-{rank}.txt")
    }
}

/// Wraps the user's command so its output is also kept in the output folder. Nothing when the job has
/// no output folder, no command, or the feature is off.
pub fn build(cx: &Context<'_>, draft: &mut Draft) -> Result<(), PipelineError> {
    let config = &cx.pipeline().output;
    let Some(output) = cx.mounts.output.as_ref() else {
        return Ok(());
    };
    if !config.enabled {
        return Ok(());
    }
    if config.max_bytes == 0 {
        return Err(PipelineError::config(
            "output.max_bytes",
            "must be at least 1; switch the output files off with `enabled = false`",
        ));
    }
    if config.helper_image.trim().is_empty() {
        return Err(PipelineError::config(
            "output.helper_image",
            "must name an image with a statically linked busybox at /bin/busybox",
        ));
    }
    let Some(argv) = draft.user.command.take().filter(|c| !c.is_empty()) else {
        return Ok(());
    };
    let busybox = format!("{HELPER_DIR}/busybox");
    let mut command = vec![
        busybox.clone(),
        "sh".to_owned(),
        "-c".to_owned(),
        WRAPPER.to_owned(),
        WRAPPER_NAME.to_owned(),
        busybox,
        WORK.to_owned(),
        config.max_bytes.to_string(),
    ];
    // Kubernetes expands `$(VAR)` in the command; the wrapper's own arguments hold none, and the
    // application's argv keeps exactly the escaping the Parameter plugin gave it.
    command.extend(argv);
    draft.user.command = Some(command);
    ensure_busybox(cx, draft);
    KEPT.annotate(
        draft,
        &cx.keys.prefix,
        output.path.clone(),
        config.max_bytes,
    );
    Ok(())
}

/// Adds the init container that copies busybox to [`HELPER_DIR`], once (a traced job's gate and tracer
/// run on it too, with or without the output files).
pub fn ensure_busybox(cx: &Context<'_>, draft: &mut Draft) {
    if draft.init.iter().any(|c| c.name == INIT_CONTAINER) {
        return;
    }
    let config = &cx.pipeline().output;
    draft.add_helper(Helper {
        name: INIT_CONTAINER,
        image: config.helper_image.clone(),
        command: vec![
            "/bin/busybox".to_owned(),
            "cp".to_owned(),
            "/bin/busybox".to_owned(),
            format!("{HELPER_DIR}/busybox"),
        ],
        env: None,
        cpu: "50m".to_owned(),
        memory: "16Mi".to_owned(),
        run_as_user: config.helper_run_as_user,
        volume: VOLUME,
        mount_path: HELPER_DIR,
    });
}

/// A wrapped command, taken apart.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Wrapped<'a> {
    /// Where the container sees the output folder (`/work`).
    pub folder: &'a str,
    /// The bound in bytes.
    pub max_bytes: u64,
    /// The application's argv.
    pub argv: &'a [String],
}

/// The parts of a command [`build`] wrapped; `None` for any other command.
pub fn unwrap(command: &[String]) -> Option<Wrapped<'_>> {
    match command {
        [_, sh, c, script, name, _, folder, max, argv @ ..]
            if sh == "sh" && c == "-c" && script == WRAPPER && name == WRAPPER_NAME =>
        {
            Some(Wrapped {
                folder,
                max_bytes: max.parse().ok()?,
                argv,
            })
        }
        _ => None,
    }
}

/// Where a job's output was kept, from its annotations: the folder and every rank's file, as storage
/// paths. `None` when the job keeps no output files.
pub fn location(
    annotations: Option<&BTreeMap<String, String>>,
    prefix: &str,
    replicas: u32,
) -> Option<KeptOutput> {
    KEPT.location(annotations, prefix, replicas).map(Into::into)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_names_are_uclouds() {
        assert_eq!(file_name(0), "stdout.txt");
        assert_eq!(file_name(3), "stdout-3.txt");
    }

    #[test]
    fn a_wrapped_command_comes_apart_again() {
        let command: Vec<String> = [
            "/.volcano-runner/busybox",
            "sh",
            "-c",
            WRAPPER,
            WRAPPER_NAME,
            "/.volcano-runner/busybox",
            "/work",
            "100",
            "python",
            "run.py",
        ]
        .map(String::from)
        .to_vec();
        let w = unwrap(&command).unwrap();
        assert_eq!(w.folder, "/work");
        assert_eq!(w.max_bytes, 100);
        assert_eq!(w.argv, ["python".to_owned(), "run.py".to_owned()]);
        assert!(unwrap(&command[..3]).is_none());
        let mut other = command.clone();
        other[3] = "echo hi".into();
        assert!(unwrap(&other).is_none());
    }

    #[test]
    fn the_wrapper_cuts_with_the_marker_of_the_output_files() {
        assert!(WRAPPER.contains(&KEPT.printed_marker()));
    }

    #[test]
    fn the_drain_bound_is_the_wrappers() {
        assert!(WRAPPER.contains(&format!("\"$b\" sleep {DRAIN_SECONDS}; kill \"$t\"")));
    }

    #[test]
    fn the_wrapper_is_posix_and_uses_only_busybox_tools() {
        for bashism in ["[[", "function ", "$'", "local ", "pipefail", "<(", "&>"] {
            assert!(!WRAPPER.contains(bashism), "{bashism}");
        }
        // What Kubernetes would rewrite in a command.
        for expanded in ["$(", "$$"] {
            assert!(!WRAPPER.contains(expanded), "{expanded}");
        }
        for tool in ["mkfifo", "dd", "cat", "wc", "tee", "rm"] {
            assert!(WRAPPER.contains(&format!("\"$b\" {tool}")), "{tool}");
        }
    }

    /// The wrapper run for real by busybox, as in the pod (`/usr/bin/busybox` from busybox-static).
    mod wrapper {
        use super::*;
        use std::path::PathBuf;
        use std::process::{Command, Output, Stdio};
        use std::sync::atomic::{AtomicU32, Ordering};
        use std::time::{Duration, Instant};

        const BUSYBOX: &str = "/usr/bin/busybox";

        fn scratch() -> PathBuf {
            static N: AtomicU32 = AtomicU32::new(0);
            let dir = std::env::temp_dir().join(format!(
                "vr-output-{}-{}",
                std::process::id(),
                N.fetch_add(1, Ordering::SeqCst)
            ));
            std::fs::create_dir_all(dir.join("helper")).unwrap();
            std::fs::create_dir_all(dir.join("work")).unwrap();
            // The real thing: Debian's statically linked busybox (scripts/test installs busybox-static).
            std::os::unix::fs::symlink(BUSYBOX, dir.join("helper/busybox"))
                .expect("busybox-static is installed (scripts/test installs it)");
            dir
        }

        fn wrapped(dir: &std::path::Path, max: u64, rank: u32, argv: &[&str]) -> Command {
            let mut cmd = Command::new(dir.join("helper/busybox"));
            cmd.arg("sh")
                .arg("-c")
                .arg(WRAPPER)
                .arg(WRAPPER_NAME)
                .arg(dir.join("helper/busybox"))
                .arg(dir.join("work"))
                .arg(max.to_string())
                .args(argv)
                .env("VC_TASK_INDEX", rank.to_string())
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            cmd
        }

        fn run(dir: &std::path::Path, max: u64, rank: u32, script: &str) -> Output {
            wrapped(dir, max, rank, &["/bin/sh", "-c", script])
                .output()
                .unwrap()
        }

        fn file(dir: &std::path::Path, rank: u32) -> String {
            std::fs::read_to_string(dir.join("work").join(file_name(rank))).unwrap()
        }

        #[test]
        fn a_failure_stays_a_failure_and_its_output_is_in_the_file_and_the_log() {
            let dir = scratch();
            let out = run(&dir, 1000, 0, "echo one; echo two >&2; exit 3");
            assert_eq!(out.status.code(), Some(3));
            assert_eq!(file(&dir, 0), "one\ntwo\n");
            assert_eq!(String::from_utf8_lossy(&out.stdout), "one\ntwo\n");
            // Nothing of the wrapper is left behind but the file.
            let left: Vec<_> = std::fs::read_dir(dir.join("helper")).unwrap().collect();
            assert_eq!(left.len(), 1);
            std::fs::remove_dir_all(dir).unwrap();
        }

        #[test]
        fn other_ranks_write_their_own_file_and_success_is_zero() {
            let dir = scratch();
            let out = run(&dir, 1000, 2, "echo rank two");
            assert_eq!(out.status.code(), Some(0));
            assert_eq!(file(&dir, 2), "rank two\n");
            assert!(!dir.join("work/stdout.txt").exists());
            std::fs::remove_dir_all(dir).unwrap();
        }

        #[test]
        fn output_past_the_bound_is_cut_with_the_marker_and_still_logged_whole() {
            let dir = scratch();
            let out = run(&dir, 10, 0, "echo 0123456789abcdef; echo more");
            assert_eq!(out.status.code(), Some(0));
            let whole = "0123456789abcdef\nmore\n";
            assert_eq!(file(&dir, 0).as_bytes(), KEPT.kept(whole.as_bytes(), 10));
            assert_eq!(String::from_utf8_lossy(&out.stdout), whole);
            // Exactly at the bound: no marker.
            let out = run(&dir, 5, 0, "printf abcde");
            assert_eq!(out.status.code(), Some(0));
            assert_eq!(file(&dir, 0), "abcde");
            std::fs::remove_dir_all(dir).unwrap();
        }

        #[test]
        fn a_signal_that_kills_the_application_is_its_exit_code() {
            let dir = scratch();
            let out = run(&dir, 1000, 0, "echo before; kill -9 $$");
            assert_eq!(out.status.code(), Some(137));
            assert_eq!(file(&dir, 0), "before\n");
            std::fs::remove_dir_all(dir).unwrap();
        }

        #[test]
        fn sigterm_reaches_the_application_and_its_last_words_are_kept() {
            let dir = scratch();
            let script =
                "trap 'echo got-term; exit 7' TERM; echo ready; while :; do sleep 0.05; done";
            let child = wrapped(&dir, 1000, 0, &["/bin/sh", "-c", script])
                .spawn()
                .unwrap();
            let deadline = Instant::now() + Duration::from_secs(20);
            while std::fs::read_to_string(dir.join("work/stdout.txt"))
                .map_or(true, |s| !s.contains("ready"))
            {
                assert!(Instant::now() < deadline, "the application never started");
                std::thread::sleep(Duration::from_millis(20));
            }
            let pid = child.id().to_string();
            assert!(
                Command::new("kill")
                    .args(["-TERM", &pid])
                    .status()
                    .unwrap()
                    .success()
            );
            let out = child.wait_with_output().unwrap();
            assert_eq!(out.status.code(), Some(7));
            assert_eq!(file(&dir, 0), "ready\ngot-term\n");
            std::fs::remove_dir_all(dir).unwrap();
        }

        /// A program that leaves a process behind (`jupyter ... &`, `tail -f ... &`) ends when it
        /// ends, with its own exit code and its output whole in the file: the copy does not wait for
        /// the process left behind, which holds the output's pipe open. On main the wrapper waited for
        /// it (600 s here).
        #[test]
        fn a_program_that_leaves_a_process_behind_ends_with_its_output_whole() {
            let dir = scratch();
            let pid_file = dir.join("left.pid");
            let script = format!(
                "sleep 600 & echo $! > {}; seq 1 2000; echo done; exit 4",
                pid_file.display()
            );
            let mut child = wrapped(&dir, 1_000_000, 0, &["/bin/sh", "-c", &script])
                .spawn()
                .unwrap();
            let started = Instant::now();
            let status = loop {
                if let Some(status) = child.try_wait().unwrap() {
                    break Some(status);
                }
                if started.elapsed() > Duration::from_secs(20) {
                    break None;
                }
                std::thread::sleep(Duration::from_millis(20));
            };
            let left = std::fs::read_to_string(&pid_file).unwrap_or_default();
            let _ = Command::new("kill").arg(left.trim()).status();
            let Some(status) = status else {
                let _ = child.kill();
                panic!("the job did not end with its program: it waits for what the program left");
            };
            assert_eq!(status.code(), Some(4));
            let mut expected: String = (1..=2000).map(|i| format!("{i}\n")).collect();
            expected.push_str("done\n");
            assert_eq!(file(&dir, 0), expected);
            let out = child.wait_with_output().unwrap();
            assert_eq!(String::from_utf8_lossy(&out.stdout), expected);
            assert_eq!(
                String::from_utf8_lossy(&out.stderr),
                "",
                "nothing of the wrapper's"
            );
            std::fs::remove_dir_all(dir).unwrap();
        }

        #[test]
        fn an_output_folder_that_cannot_be_written_runs_the_application_unwrapped() {
            let dir = scratch();
            std::fs::remove_dir_all(dir.join("work")).unwrap();
            let out = run(&dir, 1000, 0, "echo hi; exit 4");
            assert_eq!(out.status.code(), Some(4));
            assert_eq!(String::from_utf8_lossy(&out.stdout), "hi\n");
            assert!(String::from_utf8_lossy(&out.stderr).contains("cannot be kept"));
            std::fs::remove_dir_all(dir).unwrap();
        }
    }
}
