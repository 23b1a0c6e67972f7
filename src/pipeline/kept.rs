//! Files a job keeps per rank in one folder under one bound: its output
//! ([`super::plugins::output_files`]) and its trace ([`super::plugins::traced`]).
//!
//! Both kinds are recorded the same way (the folder's storage path and the bound in two annotations,
//! read back for the terminal event and `job <id>`), cut the same way (the first `max` bytes, then a
//! marker line naming the bound), and named per rank in one folder. [`PerRank`] describes one kind, so
//! the two say the same things in the same shape and cannot drift apart.

use std::collections::BTreeMap;

use super::draft::Draft;
use crate::messages::v1::{KeptOutput, KeptTrace};

/// One kind of file kept per rank.
#[derive(Debug, Clone, Copy)]
pub struct PerRank {
    /// What the files hold, as the cut marker says it (`output`, `trace`).
    pub what: &'static str,
    /// The annotation (under the prefix) with the storage path of the folder.
    pub folder_annotation: &'static str,
    /// The annotation (under the prefix) with the bound, in bytes.
    pub max_bytes_annotation: &'static str,
    /// A rank's file name in the folder.
    pub file_name: fn(u32) -> String,
}

/// Where a job's files of one kind are, as its annotations record them: what the terminal event and
/// `job <id>` name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kept {
    /// The folder, a storage path.
    pub folder: String,
    /// Every rank's file, storage paths, by rank.
    pub files: Vec<String>,
    /// The bound of each file, in bytes.
    pub max_bytes: u64,
}

/// The terminal event's records of the output files and of the traces hold the same three facts.
macro_rules! from_kept {
    ($($record:ty),*) => {$(
        impl From<Kept> for $record {
            fn from(k: Kept) -> Self {
                Self {
                    folder: k.folder,
                    files: k.files,
                    max_bytes: k.max_bytes,
                }
            }
        }
    )*};
}
from_kept!(KeptOutput, KeptTrace);

impl PerRank {
    /// The marker line appended to a file that was cut at `max` bytes (the script that writes the files
    /// prints the same line).
    pub fn cut_marker(&self, max: u64) -> String {
        let what = self.what;
        format!(
            "[volcano-runner: {what} cut here: only the first {max} bytes of this rank's {what} are kept]"
        )
    }

    /// The marker as the scripts print it: a `printf` format with the bound as `%s`, each `'` closed and
    /// reopened inside the script's single quotes.
    #[cfg(test)]
    pub(crate) fn printed_marker(&self) -> String {
        self.cut_marker(0)
            .replace(" 0 ", " %s ")
            .replace('\'', r#"'"'"'"#)
    }

    /// What a rank's file holds for everything the rank wrote (`log`): its first `max` bytes, and the
    /// marker line when that cut it. The scripts' bound, for the simulator and the tests.
    pub fn kept(&self, log: &[u8], max: u64) -> Vec<u8> {
        let max_len = usize::try_from(max).unwrap_or(usize::MAX);
        if log.len() <= max_len {
            return log.to_vec();
        }
        let mut out = log[..max_len].to_vec();
        out.extend_from_slice(format!("\n{}\n", self.cut_marker(max)).as_bytes());
        out
    }

    /// Records on the job where the files go (`folder`, a storage path) and their bound.
    pub(crate) fn annotate(&self, draft: &mut Draft, prefix: &str, folder: String, max_bytes: u64) {
        draft.annotate(&format!("{prefix}{}", self.folder_annotation), folder);
        draft.annotate(
            &format!("{prefix}{}", self.max_bytes_annotation),
            max_bytes.to_string(),
        );
    }

    /// Where a job of `replicas` ranks keeps these files, from its annotations (under `prefix`); `None`
    /// when it keeps none (no folder recorded).
    pub fn location(
        &self,
        annotations: Option<&BTreeMap<String, String>>,
        prefix: &str,
        replicas: u32,
    ) -> Option<Kept> {
        let annotations = annotations?;
        let folder = annotations.get(&format!("{prefix}{}", self.folder_annotation))?;
        let max_bytes = annotations
            .get(&format!("{prefix}{}", self.max_bytes_annotation))
            .and_then(|m| m.parse().ok())
            .unwrap_or_default();
        let base = folder.trim_end_matches('/');
        Some(Kept {
            folder: folder.clone(),
            files: (0..replicas.max(1))
                .map(|rank| format!("{base}/{}", (self.file_name)(rank)))
                .collect(),
            max_bytes,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOTES: PerRank = PerRank {
        what: "notes",
        folder_annotation: "notesFolder",
        max_bytes_annotation: "notesMaxBytes",
        file_name: |rank| format!("notes-{rank}.txt"),
    };

    #[test]
    fn the_bound_keeps_the_start_and_says_where_it_cut() {
        assert_eq!(NOTES.kept(b"abc", 3), b"abc");
        let cut = String::from_utf8(NOTES.kept(b"abcdef", 3)).unwrap();
        assert_eq!(
            cut,
            "abc\n[volcano-runner: notes cut here: only the first 3 bytes of this rank's notes are kept]\n"
        );
    }

    #[test]
    fn the_location_names_every_ranks_file_in_the_recorded_folder() {
        let annotations = BTreeMap::from([
            ("p/notesFolder".to_owned(), "/home/a/out/".to_owned()),
            ("p/notesMaxBytes".to_owned(), "100".to_owned()),
        ]);
        let kept = NOTES.location(Some(&annotations), "p/", 2).unwrap();
        assert_eq!(kept.folder, "/home/a/out/");
        assert_eq!(
            kept.files,
            ["/home/a/out/notes-0.txt", "/home/a/out/notes-1.txt"]
        );
        assert_eq!(kept.max_bytes, 100);
        // One rank at least; nothing without the folder.
        assert_eq!(
            NOTES
                .location(Some(&annotations), "p/", 0)
                .unwrap()
                .files
                .len(),
            1
        );
        assert_eq!(NOTES.location(Some(&BTreeMap::new()), "p/", 1), None);
        assert_eq!(NOTES.location(None, "p/", 1), None);
    }
}
