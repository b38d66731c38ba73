//! Password hashing with argon2 (the crate's default Argon2id parameters). Hashing
//! is deliberately slow, so it runs on the blocking pool, and no more hashes run at
//! once than there are cores: each one takes ~19 MiB, and anonymous `login`s must
//! not be able to multiply that.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use tokio::sync::Semaphore;

use argon2::Argon2;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};

use super::AuthError;

const MIN_LEN: usize = 8;
const MAX_LEN: usize = 1024;

pub fn check_strength(password: &str) -> Result<(), AuthError> {
    let len = password.chars().count();
    if len < MIN_LEN {
        return Err(AuthError::Invalid(format!(
            "password must be at least {MIN_LEN} characters"
        )));
    }
    if len > MAX_LEN {
        return Err(AuthError::Invalid(format!(
            "password must be at most {MAX_LEN} characters"
        )));
    }
    Ok(())
}

pub async fn hash(password: &str) -> Result<String, AuthError> {
    let password = password.to_owned();
    blocking(move || {
        let salt = SaltString::generate(&mut argon2::password_hash::rand_core::OsRng);
        Argon2::default()
            .hash_password(password.as_bytes(), &salt)
            .map(|h| h.to_string())
            .map_err(|e| AuthError::Hash(e.to_string()))
    })
    .await
}

/// Whether `password` matches `stored`. With nothing stored, a dummy hash is
/// checked anyway so an unknown user takes as long as a wrong password.
pub async fn verify(password: &str, stored: Option<String>) -> Result<bool, AuthError> {
    if password.len() > MAX_LEN * 4 {
        return Ok(false);
    }
    let password = password.to_owned();
    blocking(move || {
        let (target, real) = match &stored {
            Some(hash) => (hash.as_str(), true),
            None => (dummy_hash(), false),
        };
        let parsed = PasswordHash::new(target).map_err(|e| AuthError::Hash(e.to_string()))?;
        let ok = Argon2::default()
            .verify_password(password.as_bytes(), &parsed)
            .is_ok();
        Ok(ok && real)
    })
    .await
}

fn dummy_hash() -> &'static str {
    static DUMMY: OnceLock<String> = OnceLock::new();
    DUMMY.get_or_init(|| {
        let salt = SaltString::generate(&mut argon2::password_hash::rand_core::OsRng);
        Argon2::default()
            .hash_password(b"not a password anyone has", &salt)
            .expect("hashing a constant works")
            .to_string()
    })
}

/// At most this many hashes run at once: one per core.
fn hashing_slots() -> Arc<Semaphore> {
    static SLOTS: OnceLock<Arc<Semaphore>> = OnceLock::new();
    SLOTS
        .get_or_init(|| {
            let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
            Arc::new(Semaphore::new(cores))
        })
        .clone()
}

/// Hashes running now, and the most seen at once (for the test of the bound).
static RUNNING: AtomicUsize = AtomicUsize::new(0);
static MOST_RUNNING: AtomicUsize = AtomicUsize::new(0);

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, AuthError> + Send + 'static,
) -> Result<T, AuthError> {
    let slot = hashing_slots()
        .acquire_owned()
        .await
        .map_err(|e| AuthError::Hash(format!("hashing slots closed: {e}")))?;
    // The slot goes with the work, not with this future: a caller that goes away
    // does not free a slot while its hash still runs.
    tokio::task::spawn_blocking(move || {
        let now = RUNNING.fetch_add(1, Ordering::SeqCst) + 1;
        MOST_RUNNING.fetch_max(now, Ordering::SeqCst);
        let result = work();
        RUNNING.fetch_sub(1, Ordering::SeqCst);
        drop(slot);
        result
    })
    .await
    .map_err(|e| AuthError::Hash(format!("hashing task failed: {e}")))?
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn hashes_verify_and_wrong_passwords_do_not() {
        let stored = hash("correct horse").await.unwrap();
        assert!(stored.starts_with("$argon2id$"));
        assert!(verify("correct horse", Some(stored.clone())).await.unwrap());
        assert!(!verify("wrong horse", Some(stored)).await.unwrap());
        assert!(!verify("anything", None).await.unwrap());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn no_more_hashes_run_at_once_than_there_are_cores() {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        let checks: Vec<_> = (0..cores * 3)
            .map(|_| tokio::spawn(verify("a wrong password", None)))
            .collect();
        for check in checks {
            assert!(!check.await.unwrap().unwrap());
        }
        let most = MOST_RUNNING.load(Ordering::SeqCst);
        assert!(
            (1..=cores).contains(&most),
            "{most} hashes ran at once on {cores} cores"
        );
    }

    #[test]
    fn short_passwords_are_refused() {
        assert!(check_strength("short").is_err());
        assert!(check_strength("long enough").is_ok());
    }
}
