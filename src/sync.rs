//! Locking a `std` mutex or read-write lock whatever a panic left behind,
//! and a one-way signal (a lease's loss).
//!
//! Every section of this crate that holds one makes a single change (an
//! insert, a remove, a replaced value), so a panic inside it cannot leave
//! the data half-updated in a way that matters. A poisoned lock is used as
//! it is, rather than turned into a panic in every later call (a panic on
//! the request path, or in the watchdog, for every lock of the process).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

use tokio::sync::Notify;

/// `m.lock()`, poisoned or not.
pub(crate) fn lock<T: ?Sized>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// `l.read()`, poisoned or not.
pub(crate) fn read<T: ?Sized>(l: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    l.read().unwrap_or_else(|p| p.into_inner())
}

/// `l.write()`, poisoned or not.
pub(crate) fn write<T: ?Sized>(l: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    l.write().unwrap_or_else(|p| p.into_inner())
}

/// A signal told once and heard by every waiter, whether it waits before
/// or after: a lease's loss (`Lease::lost`). Held inline (a flag and a
/// `Notify`), so a lease costs no allocation of its own for it, as a
/// cancellation token's shared node did (an allocation and its
/// reference counts on every grant).
#[derive(Debug, Default)]
pub(crate) struct Signal {
    told: AtomicBool,
    notify: Notify,
}

impl Signal {
    /// Tells every waiter, now and later. Only the first call does.
    pub(crate) fn cancel(&self) {
        if !self.told.swap(true, Ordering::SeqCst) {
            self.notify.notify_waiters();
        }
    }

    /// Whether it has been told.
    pub(crate) fn is_cancelled(&self) -> bool {
        self.told.load(Ordering::SeqCst)
    }

    /// Resolves once it has been told (at once if it was already).
    pub(crate) async fn cancelled(&self) {
        loop {
            // Registered before the flag is read: a `cancel` after the
            // read wakes this wait (`notify_waiters` reaches every
            // `Notified` made before it, polled or not).
            let notified = self.notify.notified();
            if self.is_cancelled() {
                return;
            }
            notified.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::{Mutex, RwLock};

    use super::{Signal, lock, read, write};

    #[tokio::test]
    async fn a_signal_is_heard_by_waiters_before_and_after_it_is_told() {
        let s = std::sync::Arc::new(Signal::default());
        assert!(!s.is_cancelled());
        let early = tokio::spawn({
            let s = s.clone();
            async move { s.cancelled().await }
        });
        // The early waiter is waiting (not told yet).
        tokio::task::yield_now().await;
        assert!(!early.is_finished());
        s.cancel();
        s.cancel(); // (Idempotent.)
        let heard = |w| tokio::time::timeout(std::time::Duration::from_secs(5), w);
        heard(early)
            .await
            .expect("the early waiter missed it")
            .unwrap();
        assert!(s.is_cancelled());
        // A waiter that comes after is told at once.
        heard(tokio::spawn(async move { s.cancelled().await }))
            .await
            .expect("a late waiter missed it")
            .unwrap();
    }

    #[test]
    fn a_signal_told_on_another_thread_while_a_waiter_registers_is_never_missed() {
        // Many rounds of a `cancel` racing a waiter's start, each on its
        // own thread: a waiter that read the flag before the `cancel` and
        // registered after it would hang here (bounded by the timeout).
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_time()
            .build()
            .unwrap();
        for _ in 0..10_000 {
            let s = std::sync::Arc::new(Signal::default());
            // The teller waits until the waiter is about to start waiting:
            // the `cancel` then falls in or near its registration.
            let started = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let waiter = rt.spawn({
                let (s, started) = (s.clone(), started.clone());
                async move {
                    started.store(true, std::sync::atomic::Ordering::SeqCst);
                    s.cancelled().await
                }
            });
            let teller = std::thread::spawn({
                let s = s.clone();
                move || {
                    while !started.load(std::sync::atomic::Ordering::SeqCst) {
                        std::hint::spin_loop();
                    }
                    s.cancel();
                }
            });
            teller.join().unwrap();
            rt.block_on(async {
                tokio::time::timeout(std::time::Duration::from_secs(5), waiter)
                    .await
                    .expect("a waiter missed the signal")
                    .unwrap();
            });
        }
    }

    /// Runs `f` on another thread, which panics while `f` holds its lock.
    fn panic_while_holding(f: impl FnOnce() + Send) {
        std::thread::scope(|s| {
            assert!(s.spawn(f).join().is_err(), "the thread panicked");
        });
    }

    #[test]
    fn a_mutex_poisoned_by_a_panic_is_still_locked_and_keeps_its_value() {
        let m = Mutex::new(1);
        panic_while_holding(|| {
            let mut g = lock(&m);
            *g = 2;
            panic!("while holding the mutex");
        });
        assert!(m.is_poisoned());
        assert_eq!(*lock(&m), 2);
        *lock(&m) = 3;
        assert_eq!(*lock(&m), 3);
    }

    #[test]
    fn a_rwlock_poisoned_by_a_panic_is_still_read_and_written() {
        let l = RwLock::new(1);
        panic_while_holding(|| {
            let mut g = write(&l);
            *g = 2;
            panic!("while holding the write lock");
        });
        assert!(l.is_poisoned());
        assert_eq!(*read(&l), 2);
        *write(&l) = 3;
        assert_eq!(*read(&l), 3);
    }
}
