//! Log lines captured from the crate, for tests of what it reports.

use std::sync::{Arc, Mutex};

/// Log lines written while the guard of [`Logs::capture`] lives (on this
/// thread: use a current-thread runtime).
#[derive(Clone, Default)]
pub struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    /// Captures events at `level` and above until the guard is dropped.
    pub fn capture_at(level: tracing::Level) -> (Logs, tracing::subscriber::DefaultGuard) {
        let logs = Logs::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(level)
            .with_writer(move || writer.clone())
            .finish();
        (logs, tracing::subscriber::set_default(subscriber))
    }

    /// Captures warnings and errors.
    pub fn capture() -> (Logs, tracing::subscriber::DefaultGuard) {
        Logs::capture_at(tracing::Level::WARN)
    }

    /// Everything captured so far.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }

    /// The captured lines that contain `needle`.
    pub fn lines_with(&self, needle: &str) -> Vec<String> {
        self.text()
            .lines()
            .filter(|l| l.contains(needle))
            .map(str::to_owned)
            .collect()
    }
}

impl std::io::Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    /// The process-wide capture: installed as the global subscriber on the
    /// first call (warnings and errors), shared by every test of the binary.
    /// Scoped capture ([`Logs::capture`]) can miss events while tests run in
    /// parallel (callsite interest is cached process-wide), so tests that
    /// assert on logs use this and look for lines only they can cause.
    pub fn global() -> Logs {
        static GLOBAL: std::sync::OnceLock<Logs> = std::sync::OnceLock::new();
        GLOBAL
            .get_or_init(|| {
                let logs = Logs::default();
                let writer = logs.clone();
                let subscriber = tracing_subscriber::fmt()
                    .with_ansi(false)
                    .with_max_level(tracing::Level::WARN)
                    .with_writer(move || writer.clone())
                    .finish();
                tracing::subscriber::set_global_default(subscriber)
                    .expect("no other global subscriber in this test binary");
                logs
            })
            .clone()
    }
}
