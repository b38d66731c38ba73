//! Password hashing with argon2 (the crate's default Argon2id parameters). Hashing
//! is deliberately slow, so it runs on the blocking pool.

use std::sync::OnceLock;

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

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, AuthError> + Send + 'static,
) -> Result<T, AuthError> {
    tokio::task::spawn_blocking(work)
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

    #[test]
    fn short_passwords_are_refused() {
        assert!(check_strength("short").is_err());
        assert!(check_strength("long enough").is_ok());
    }
}
