//! Where the store lives: a SQLite file or a PostgreSQL URL, parsed and checked
//! once, shown without credentials.

use std::path::PathBuf;

use crate::redact::is_credential_name;

/// A database URL that cannot be used; the message never holds the URL itself
/// (it may carry a password).
#[derive(Debug, thiserror::Error)]
#[error("invalid database URL: {0}")]
pub struct InvalidDatabaseUrl(String);

/// What a redacted database URL shows in place of its password (as the
/// other redacted URLs do, see `crate::redact`).
pub const REDACTED: &str = "***";

/// Where the store lives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum DatabaseLocation {
    Sqlite(PathBuf),
    Postgres(url::Url),
}

impl DatabaseLocation {
    pub fn parse(raw: &str) -> Result<Self, InvalidDatabaseUrl> {
        let url = url::Url::parse(raw).map_err(|e| {
            // The raw text may hold a password: name the problem, not the value.
            InvalidDatabaseUrl(format!("not a URL ({e})"))
        })?;
        match url.scheme() {
            "sqlite" => {
                let path = raw
                    .trim_start_matches("sqlite://")
                    .trim_start_matches("sqlite:");
                let path = path.split('?').next().unwrap_or_default();
                if path.is_empty() {
                    return Err(InvalidDatabaseUrl(
                        "sqlite URL names no file (sqlite://PATH)".into(),
                    ));
                }
                Ok(Self::Sqlite(PathBuf::from(path)))
            }
            "postgres" | "postgresql" => {
                if url.host_str().is_none_or(str::is_empty) {
                    return Err(InvalidDatabaseUrl("postgres URL names no host".into()));
                }
                Ok(Self::Postgres(url))
            }
            other => Err(InvalidDatabaseUrl(format!(
                "unsupported scheme `{other}` (use sqlite:// or postgres://)"
            ))),
        }
    }

    /// `"sqlite"` or `"postgres"`, as `serverInfo.database` reports it.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Sqlite(_) => "sqlite",
            Self::Postgres(_) => "postgres",
        }
    }

    /// The URL sea-orm connects with (it holds the password, if any).
    pub fn connect_url(&self) -> String {
        match self {
            Self::Sqlite(path) => format!("sqlite://{}?mode=rwc", path.display()),
            Self::Postgres(url) => url.to_string(),
        }
    }

    /// The location without credentials, fit for logs and `corbel config`.
    pub fn redacted(&self) -> String {
        match self {
            Self::Sqlite(path) => format!("sqlite://{}", path.display()),
            Self::Postgres(url) => {
                let mut url = url.clone();
                if url.password().is_some() {
                    let _ = url.set_password(Some(REDACTED));
                }
                // `?password=` (and `sslpassword`, …) hold one as well.
                if url.query_pairs().any(|(name, _)| is_credential_name(&name)) {
                    let pairs: Vec<(String, String)> = url
                        .query_pairs()
                        .map(|(name, value)| {
                            let value = match is_credential_name(&name) {
                                true => REDACTED.to_owned(),
                                false => value.into_owned(),
                            };
                            (name.into_owned(), value)
                        })
                        .collect();
                    url.query_pairs_mut().clear().extend_pairs(pairs);
                }
                url.to_string()
            }
        }
    }

    /// The passwords the location carries (userinfo and parameters).
    fn passwords(&self) -> Vec<String> {
        match self {
            Self::Sqlite(_) => Vec::new(),
            Self::Postgres(url) => url
                .password()
                .map(str::to_owned)
                .into_iter()
                .chain(
                    url.query_pairs()
                        .filter(|(name, _)| is_credential_name(name))
                        .map(|(_, value)| value.into_owned()),
                )
                .collect(),
        }
    }

    /// Whether the location carries a password (which [`Self::redacted`] hides).
    pub fn has_password(&self) -> bool {
        !self.passwords().is_empty()
    }

    /// Whether the password is the placeholder [`Self::redacted`] shows: a URL
    /// copied from `corbel config` without the real password put back.
    pub fn has_redacted_password(&self) -> bool {
        self.passwords().iter().any(|p| p == REDACTED)
    }

    /// What identifies the store itself, independent of credentials and of how a
    /// replica spells a relative path: hashed into `serverInfo.instanceId`, so
    /// replicas on one store share it.
    pub fn identity(&self) -> String {
        match self {
            Self::Sqlite(path) => {
                let absolute = std::path::absolute(path).unwrap_or_else(|_| path.clone());
                format!("sqlite:{}", absolute.display())
            }
            Self::Postgres(url) => format!(
                "postgres:{}:{}{}",
                url.host_str().unwrap_or_default(),
                url.port().unwrap_or(5432),
                url.path()
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn database_urls_are_checked() {
        assert!(DatabaseLocation::parse("mysql://x/y").is_err());
        assert!(DatabaseLocation::parse("not a url").is_err());
        let pg = DatabaseLocation::parse("postgres://u:p@db.example:6543/c").unwrap();
        assert_eq!(pg.identity(), "postgres:db.example:6543/c");
        let other_creds = DatabaseLocation::parse("postgres://v:q@db.example:6543/c").unwrap();
        assert_eq!(pg.identity(), other_creds.identity());
    }

    #[test]
    fn a_redacted_url_shows_its_placeholder_literally_and_is_known_as_redacted() {
        let pg = DatabaseLocation::parse("postgres://u:p%40ss@db.example:6543/c").unwrap();
        let shown = pg.redacted();
        assert_eq!(shown, "postgres://u:***@db.example:6543/c");
        assert!(pg.has_password() && !pg.has_redacted_password());
        assert!(
            DatabaseLocation::parse(&shown)
                .unwrap()
                .has_redacted_password()
        );
        let no_password = DatabaseLocation::parse("postgres://u@db.example/c").unwrap();
        assert_eq!(no_password.redacted(), "postgres://u@db.example/c");
    }

    #[test]
    fn a_password_given_as_a_parameter_is_redacted_too() {
        let pg = DatabaseLocation::parse(
            "postgres://u@db.example/c?sslmode=require&password=s3cret&sslpassword=k3y",
        )
        .unwrap();
        let shown = pg.redacted();
        assert_eq!(
            shown,
            "postgres://u@db.example/c?sslmode=require&password=***&sslpassword=***"
        );
        assert!(pg.has_password() && !pg.has_redacted_password());
        assert!(
            DatabaseLocation::parse(&shown)
                .unwrap()
                .has_redacted_password()
        );
    }
}
