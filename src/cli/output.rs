//! How a command prints its answer (`--output text|json`): one choice shared by `admin`, its
//! `dead-letters` and `events`, below all three.

/// How a command's answer is printed: text for a person, JSON for a program.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Text,
    Json,
}
