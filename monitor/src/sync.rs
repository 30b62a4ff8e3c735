//! Locks that outlive a panic: a thread that panicked while holding one leaves its data as
//! it was, and the agent keeps serving and can still detach at exit. Every lock in the
//! agent is taken through these.

use std::sync::{Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Locks `mutex`, poisoned or not.
pub fn lock<T: ?Sized>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Read-locks `lock`, poisoned or not.
pub fn read<T: ?Sized>(lock: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    lock.read().unwrap_or_else(PoisonError::into_inner)
}

/// Write-locks `lock`, poisoned or not.
pub fn write<T: ?Sized>(lock: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    lock.write().unwrap_or_else(PoisonError::into_inner)
}

/// The value of `mutex`, borrowed mutably without locking (its owner has `&mut`), poisoned or not.
pub fn get_mut<T: ?Sized>(mutex: &mut Mutex<T>) -> &mut T {
    mutex.get_mut().unwrap_or_else(PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_poisoned_lock_still_gives_its_data() {
        let mutex = Mutex::new(1);
        let rwlock = RwLock::new(2);
        std::thread::scope(|scope| {
            let _ = scope
                .spawn(|| {
                    let _held = (mutex.lock(), rwlock.write());
                    panic!("poisoning both");
                })
                .join();
        });
        assert!(mutex.is_poisoned() && rwlock.is_poisoned());
        *lock(&mutex) += 1;
        *write(&rwlock) += 1;
        assert_eq!((*lock(&mutex), *read(&rwlock)), (2, 3));
    }
}
