//! Locking a `std` mutex or read-write lock whatever a panic left behind.
//!
//! Every section of this crate that holds one makes a single change (an
//! insert, a remove, a replaced value), so a panic inside it cannot leave
//! the data half-updated in a way that matters. A poisoned lock is used as
//! it is, rather than turned into a panic in every later call (a panic on
//! the request path, or in the watchdog, for every lock of the process).

use std::sync::{Mutex, MutexGuard, RwLock, RwLockReadGuard, RwLockWriteGuard};

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

#[cfg(test)]
mod tests {
    use std::sync::{Mutex, RwLock};

    use super::{lock, read, write};

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
