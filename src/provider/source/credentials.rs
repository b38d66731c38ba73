//! The credentials a fetch offers a server that asks for them.

use std::path::PathBuf;

/// Credentials offered to a server that asks, each tried once: a user name and
/// password in the URL (https), then the SSH agent, then the user's default SSH
/// keys. libgit2 asks again after each refusal, so every offer is counted.
#[derive(Default)]
pub(super) struct Credentials {
    userpass_tried: bool,
    agent_tried: bool,
    keys_tried: usize,
}

impl Credentials {
    const KEYS: [&'static str; 3] = ["id_ed25519", "id_ecdsa", "id_rsa"];

    pub(super) fn next(
        &mut self,
        url: &str,
        username: Option<&str>,
        allowed: git2::CredentialType,
    ) -> Result<git2::Cred, git2::Error> {
        use git2::{Cred, CredentialType};
        if allowed.contains(CredentialType::USER_PASS_PLAINTEXT) && !self.userpass_tried {
            self.userpass_tried = true;
            if let Ok(parsed) = url::Url::parse(url)
                && let Some(password) = parsed.password()
            {
                return Cred::userpass_plaintext(parsed.username(), password);
            }
        }
        let user = username.unwrap_or("git");
        if allowed.contains(CredentialType::SSH_KEY) {
            if !self.agent_tried {
                self.agent_tried = true;
                if std::env::var_os("SSH_AUTH_SOCK").is_some() {
                    return Cred::ssh_key_from_agent(user);
                }
            }
            let home = std::env::var_os("HOME").map(PathBuf::from);
            while let Some(home) = &home
                && self.keys_tried < Self::KEYS.len()
            {
                let key = home.join(".ssh").join(Self::KEYS[self.keys_tried]);
                self.keys_tried += 1;
                if key.is_file() {
                    return Cred::ssh_key(user, None, &key, None);
                }
            }
        }
        if allowed.contains(CredentialType::USERNAME) {
            return Cred::username(user);
        }
        Err(git2::Error::from_str(
            "the server wants credentials and none were accepted (tried: URL user and password, SSH agent, ~/.ssh keys)",
        ))
    }
}
