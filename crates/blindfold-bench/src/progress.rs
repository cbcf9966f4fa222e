use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A progress bar on standard error, hidden when `show` is false (tests, CI logs).
pub(crate) fn bar(len: u64, what: &str, show: bool) -> ProgressBar {
    let pb = ProgressBar::with_draw_target(
        Some(len),
        if show { ProgressDrawTarget::stderr() } else { ProgressDrawTarget::hidden() },
    );
    pb.set_style(
        ProgressStyle::with_template(
            "{msg:>18} [{bar:32}] {human_pos}/{human_len} ({per_sec}, eta {eta})",
        )
        .expect("valid template")
        .progress_chars("=> "),
    );
    pb.set_message(what.to_string());
    pb
}
