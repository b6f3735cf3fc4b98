//! The receiver's settings, read from the environment.

use std::time::Duration;

use super::app::Options;
use super::common::{Env, Timeouts};
use super::{DEFAULT_SECRET, DEFAULT_TIMEOUTS, DEFAULT_WORK};

/// The receiver's settings, read from the environment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Port on 127.0.0.1.
    pub port: u16,
    /// Redis URL, if any.
    pub redis_url: Option<String>,
    /// Signing secret.
    pub secret: String,
    /// Work per delivery.
    pub work: Duration,
    /// How long a client may take.
    pub timeouts: Timeouts,
}

impl Settings {
    /// Reads the settings through `var` (the process environment in
    /// `main`). An unset or empty variable takes its default.
    pub fn from_lookup(var: impl Fn(&str) -> Option<String>) -> Result<Settings, String> {
        let env = Env(&var);
        Ok(Settings {
            port: env.port()?,
            redis_url: env.get("REDIS_URL"),
            secret: env
                .get("WEBHOOK_SECRET")
                .unwrap_or_else(|| DEFAULT_SECRET.to_owned()),
            work: env.millis("WORK_MS", DEFAULT_WORK)?,
            timeouts: Timeouts::from_lookup(&var, DEFAULT_TIMEOUTS)?,
        })
    }

    /// The [`Options`] of these settings.
    pub fn options(&self) -> Options {
        Options {
            secret: self.secret.clone(),
            work: self.work,
            ..Options::default()
        }
    }
}
