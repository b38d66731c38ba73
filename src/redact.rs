//! The one redaction of URLs for display: every API answer and log line that
//! shows a URL a user gave (a repository's `driver.url`, a provider's `gitUrl`,
//! errors and status messages quoting them) goes through [`url`] or
//! [`message`]. A leaf: it uses nothing else of the crate.
//!
//! What is hidden (replaced by `***`):
//! - the userinfo of a `scheme://` URL, whole: `https://TOKEN@host`,
//!   `https://TOKEN:x-oauth-basic@host` and `https://oauth2:TOKEN@host` all put
//!   the secret in a different part, so no part is kept. For ssh (`ssh://`,
//!   `git+ssh://`, `ssh+git://` and the scp form `user@host:path`) the user
//!   name is an account (`git@`), never a secret: it is kept, and only a
//!   password after it is hidden;
//! - the value of any query or fragment parameter whose name looks like a
//!   credential (see [`is_credential_name`]), case-insensitively and after
//!   percent-decoding the name.
//!
//! Anything else (hosts, ports, paths, other parameters) is shown as given, and
//! text that is not a URL at all comes back unchanged.

/// What stands for a hidden part.
pub const HIDDEN: &str = "***";

/// `text` as it may be shown; see the module docs.
pub fn url(text: &str) -> String {
    let parts = Parts::of(text);
    let mut out = String::with_capacity(text.len());
    out.push_str(&text[..parts.userinfo_start]);
    if let Some(userinfo) = parts.userinfo {
        match (parts.keeps_user, userinfo.split_once(':')) {
            (true, None) => out.push_str(userinfo),
            (true, Some((user, _))) => {
                out.push_str(user);
                out.push(':');
                out.push_str(HIDDEN);
            }
            (false, _) => out.push_str(HIDDEN),
        }
        out.push('@');
    }
    let rest = &text[parts.after_userinfo..];
    // Parameters are read from the first `?` or `#` of what follows.
    match rest.find(['?', '#']) {
        None => out.push_str(rest),
        Some(at) => {
            out.push_str(&rest[..at]);
            out.push_str(&redact_parameters(&rest[at..]));
        }
    }
    out
}

/// The secrets `text` carries, as written and percent-decoded, longest first:
/// what must never appear in anything shown.
pub fn secrets(text: &str) -> Vec<String> {
    let parts = Parts::of(text);
    let mut found = Vec::new();
    if let Some(userinfo) = parts.userinfo {
        match (parts.keeps_user, userinfo.split_once(':')) {
            (true, None) => {}
            (true, Some((_, password))) => found.push(password.to_owned()),
            (false, None) => found.push(userinfo.to_owned()),
            (false, Some((user, password))) => {
                found.push(user.to_owned());
                found.push(password.to_owned());
            }
        }
    }
    let rest = &text[parts.after_userinfo..];
    if let Some(at) = rest.find(['?', '#']) {
        for pair in rest[at + 1..].split(['&', ';', '#', '?']) {
            if let Some((name, value)) = pair.split_once('=')
                && is_credential_name(name)
            {
                found.push(value.to_owned());
            }
        }
    }
    let decoded: Vec<String> = found.iter().map(|s| percent_decode(s)).collect();
    found.extend(decoded);
    // Very short values (`x`, `1`) would blank out unrelated text; they are
    // hidden in the URL itself but not hunted for elsewhere.
    found.retain(|s| s.len() >= 3);
    found.sort_by_key(|s| std::cmp::Reverse(s.len()));
    found.dedup();
    found
}

/// `text` (an error message, a log line) with `url` shown redacted and every
/// secret of `url` hidden wherever else it appears (libraries quote URLs
/// decoded, or quote only a part of them).
pub fn message(text: &str, url: &str) -> String {
    let mut out = if url.is_empty() {
        text.to_owned()
    } else {
        text.replace(url, &self::url(url))
    };
    for secret in secrets(url) {
        out = out.replace(&secret, HIDDEN);
    }
    out
}

/// Whether a query parameter named `name` holds a credential: a known name, or
/// one ending like one (`private_token`, `client_secret`, `x-api-key`).
pub fn is_credential_name(name: &str) -> bool {
    let name = percent_decode(name).to_ascii_lowercase().replace('-', "_");
    const EXACT: &[&str] = &[
        "access_token",
        "token",
        "key",
        "api_key",
        "apikey",
        "password",
        "passwd",
        "pass",
        "pwd",
        "secret",
        "sig",
        "signature",
        "auth",
        "authorization",
        "credential",
        "credentials",
        "code",
        "session",
        "sessionid",
        "x_amz_signature",
        "x_amz_credential",
        "x_amz_security_token",
        "x_goog_signature",
        "x_goog_credential",
    ];
    const ENDINGS: &[&str] = &[
        "token",
        "secret",
        "password",
        "passwd",
        "_key",
        "apikey",
        "signature",
        "credential",
        "_auth",
    ];
    EXACT.contains(&name.as_str()) || ENDINGS.iter().any(|e| name.ends_with(e))
}

/// Where the userinfo of `text` sits, if it has one.
struct Parts<'a> {
    /// Where the userinfo starts (or would): everything before is kept.
    userinfo_start: usize,
    userinfo: Option<&'a str>,
    /// Just after the `@` (or `userinfo_start` without userinfo).
    after_userinfo: usize,
    /// ssh forms: the user is an account name, not a secret.
    keeps_user: bool,
}

impl<'a> Parts<'a> {
    fn of(text: &'a str) -> Self {
        let none = |start| Parts {
            userinfo_start: start,
            userinfo: None,
            after_userinfo: start,
            keeps_user: false,
        };
        if let Some(scheme) = scheme(text) {
            let start = scheme.len() + 3;
            let authority_end = text[start..]
                .find(['/', '?', '#'])
                .map_or(text.len(), |i| start + i);
            return match text[start..authority_end].rfind('@') {
                Some(at) => Parts {
                    userinfo_start: start,
                    userinfo: Some(&text[start..start + at]),
                    after_userinfo: start + at + 1,
                    keeps_user: matches!(
                        scheme.to_ascii_lowercase().as_str(),
                        "ssh" | "git+ssh" | "ssh+git"
                    ),
                },
                None => none(start),
            };
        }
        // The scp form, `[user[:password]@]host:path`, as git reads it: a `:`
        // before any `/`. A local path has a `/` first (or no `:`).
        let first_slash = text.find('/').unwrap_or(text.len());
        if !text[..first_slash].contains(':') {
            return none(0);
        }
        match text[..first_slash].rfind('@') {
            Some(at) => Parts {
                userinfo_start: 0,
                userinfo: Some(&text[..at]),
                after_userinfo: at + 1,
                keeps_user: true,
            },
            None => none(0),
        }
    }
}

/// The scheme of a `scheme://…` text. Read loosely (any text with no `/`,
/// `?`, `#`, `@` or space before `://`), so a malformed scheme still gets its
/// userinfo hidden.
fn scheme(text: &str) -> Option<&str> {
    let end = text.find("://")?;
    let scheme = &text[..end];
    let plausible = !scheme.is_empty() && !scheme.contains(['/', '?', '#', '@', ' ', ':']);
    plausible.then_some(scheme)
}

/// `?a=1&token=x#frag` with each credential's value hidden. Separators are
/// kept as they are.
fn redact_parameters(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while !rest.is_empty() {
        let sep_len = rest
            .chars()
            .next()
            .filter(|c| "?#&;".contains(*c))
            .map_or(0, char::len_utf8);
        out.push_str(&rest[..sep_len]);
        rest = &rest[sep_len..];
        let end = rest.find(['&', ';', '#', '?']).unwrap_or(rest.len());
        let pair = &rest[..end];
        match pair.split_once('=') {
            Some((name, value)) if is_credential_name(name) && !value.is_empty() => {
                out.push_str(name);
                out.push('=');
                out.push_str(HIDDEN);
            }
            _ => out.push_str(pair),
        }
        rest = &rest[end..];
    }
    out
}

/// `%XX` decoded where it makes valid UTF-8; anything else kept as written.
fn percent_decode(text: &str) -> String {
    if !text.contains('%') {
        return text.to_owned();
    }
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2]))
        {
            out.push((h * 16 + l) as u8);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).unwrap_or_else(|_| text.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_url_form() {
        let cases = [
            // Scheme URLs: userinfo hidden whole.
            (
                "https://user:hunter22@example.com/a.git",
                "https://***@example.com/a.git",
            ),
            (
                "https://TOKEN@example.com/a@b.git",
                "https://***@example.com/a@b.git",
            ),
            (
                "http://user:s3cret@127.0.0.1:8080/",
                "http://***@127.0.0.1:8080/",
            ),
            ("HTTP://u:p@host", "HTTP://***@host"),
            ("https://:pw@host/x", "https://***@host/x"),
            ("https://a%40b:p%3Ass@host/", "https://***@host/"),
            ("http://user:pw@[::1]:8080/r", "http://***@[::1]:8080/r"),
            (
                "http://[fe80::1]:80/?token=abc",
                "http://[fe80::1]:80/?token=***",
            ),
            ("git://user:pw@host/r.git", "git://***@host/r.git"),
            ("file:///srv/r.git", "file:///srv/r.git"),
            ("file://user:pw@/srv/r", "file://***@/srv/r"),
            // ssh: the account stays, a password goes.
            (
                "ssh://git@example.com/org/r.git",
                "ssh://git@example.com/org/r.git",
            ),
            (
                "ssh://git:pw@example.com:22/r",
                "ssh://git:***@example.com:22/r",
            ),
            ("git+ssh://me:pw@h/r", "git+ssh://me:***@h/r"),
            // The scp form.
            ("git@example.com:org/a.git", "git@example.com:org/a.git"),
            (
                "user:pass@example.com:org/a.git",
                "user:***@example.com:org/a.git",
            ),
            ("example.com:org/a.git", "example.com:org/a.git"),
            // Local paths: nothing to hide, '@' included.
            ("/srv/a@b/repo", "/srv/a@b/repo"),
            ("./a:b@c/x", "./a:b@c/x"),
            ("relative/dir", "relative/dir"),
            // Queries and fragments.
            (
                "https://h/p?access_token=t0ken&page=2",
                "https://h/p?access_token=***&page=2",
            ),
            (
                "https://h/p?ACCESS_TOKEN=x&Api-Key=y",
                "https://h/p?ACCESS_TOKEN=***&Api-Key=***",
            ),
            (
                "https://h/p?private_token=x;sig=y",
                "https://h/p?private_token=***;sig=***",
            ),
            (
                "https://b.s3.amazonaws.com/k?X-Amz-Credential=AK%2F1&X-Amz-Signature=ff&X-Amz-Date=1",
                "https://b.s3.amazonaws.com/k?X-Amz-Credential=***&X-Amz-Signature=***&X-Amz-Date=1",
            ),
            (
                "https://h/p?access%5Ftoken=x",
                "https://h/p?access%5Ftoken=***",
            ),
            (
                "https://h/p#access_token=x&state=s",
                "https://h/p#access_token=***&state=s",
            ),
            ("https://h/p?q=1#frag", "https://h/p?q=1#frag"),
            ("https://h/p?token=", "https://h/p?token="),
            ("https://h/p?token", "https://h/p?token"),
            ("https://u:p@h?password=x", "https://***@h?password=***"),
            (
                "http://user:pw@host:8080?monkey=1",
                "http://***@host:8080?monkey=1",
            ),
            // Garbage comes back as it was, or with less in it.
            ("", ""),
            ("not a url", "not a url"),
            ("://x@y", "://x@y"),
            ("@@@", "@@@"),
            ("a:b@c", "a:***@c"),
            ("héllo://ü:p@h/€", "héllo://***@h/€"),
            ("https://h/%zz?key=%", "https://h/%zz?key=***"),
        ];
        for (input, shown) in cases {
            assert_eq!(url(input), shown, "{input}");
        }
    }

    #[test]
    fn secrets_are_found_raw_and_decoded() {
        let found = secrets("https://us%40er:p%3Ass@h/?access_token=t0ken&x=1");
        for s in ["us%40er", "us@er", "p%3Ass", "p:ss", "t0ken"] {
            assert!(found.iter().any(|f| f == s), "{s} in {found:?}");
        }
        assert!(!found.iter().any(|f| f == "1"));
        assert!(secrets("ssh://git@h/r").is_empty());
        assert_eq!(secrets("user:pass@h:r"), vec!["pass".to_owned()]);
    }

    #[test]
    fn messages_lose_every_secret() {
        let raw = "http://user:s3cretpass@127.0.0.1:9/?access_token=t0ken";
        let text = format!(
            "GET {raw}: error sending request for url (http://127.0.0.1:9/?access_token=t0ken) as s3cretpass"
        );
        let shown = message(&text, raw);
        assert!(
            !shown.contains("s3cretpass") && !shown.contains("t0ken"),
            "{shown}"
        );
        assert!(
            shown.starts_with("GET http://***@127.0.0.1:9/?access_token=***: "),
            "{shown}"
        );
    }

    #[test]
    fn credential_names() {
        for name in [
            "token",
            "Access_Token",
            "client_secret",
            "x-api-key",
            "X-Amz-Signature",
            "apikey",
            "passwd",
        ] {
            assert!(is_credential_name(name), "{name}");
        }
        for name in ["page", "ref", "monkey", "tokenizer", "q", "signed"] {
            assert!(!is_credential_name(name), "{name}");
        }
    }
}
