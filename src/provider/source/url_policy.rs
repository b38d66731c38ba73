//! URL policy for fetching: how git would read a URL (a transport helper, a
//! scheme, scp-like or a local path), which of those may be fetched, and how a
//! URL or a libgit2 message naming it is shown (credentials hidden, control
//! characters escaped). No IO but a local path's `stat`.

use std::path::PathBuf;

use super::{SourceError, SourceSettings};
use crate::redact;

/// How git would read a URL, following git's own rules (`transport.c`, `connect.c`).
#[derive(Debug, PartialEq, Eq)]
enum UrlForm<'a> {
    /// `name::address`: a remote helper, e.g. `ext::sh -c …`.
    Helper(&'a str),
    /// `scheme://…`
    Scheme(&'a str),
    /// `[user@]host:path`
    ScpLike,
    /// An absolute or relative path.
    LocalPath,
}

fn url_form(url: &str) -> UrlForm<'_> {
    let scheme_len = url
        .char_indices()
        .take_while(|&(i, c)| {
            c.is_ascii_alphabetic() || (i > 0 && (c.is_ascii_digit() || "+.-".contains(c)))
        })
        .count();
    let (scheme, rest) = url.split_at(scheme_len);
    if scheme_len > 0 && rest.starts_with("::") {
        return UrlForm::Helper(scheme);
    }
    if scheme_len > 0 && rest.starts_with("://") {
        return UrlForm::Scheme(scheme);
    }
    match (url.find(':'), url.find('/')) {
        (None, _) => UrlForm::LocalPath,
        (Some(colon), Some(slash)) if slash < colon => UrlForm::LocalPath,
        _ => UrlForm::ScpLike,
    }
}

/// A `scheme://` URL cut around its userinfo: `(scheme, userinfo, everything after)`.
fn split_userinfo(url: &str) -> Option<(&str, Option<&str>, &str)> {
    let UrlForm::Scheme(scheme) = url_form(url) else {
        return None;
    };
    let rest = &url[scheme.len() + 3..];
    let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    Some(match rest[..authority_end].rfind('@') {
        Some(at) => (scheme, Some(&rest[..at]), &rest[at + 1..]),
        None => (scheme, None, rest),
    })
}

/// `url` as it may be shown: credentials hidden (`crate::redact`), control
/// characters escaped.
pub fn display_url(url: &str) -> String {
    escape_controls(&redact::url(url))
}

/// Escapes control characters only, so paths and hosts stay readable.
pub(super) fn escape_controls(text: &str) -> String {
    text.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// A message from libgit2 made safe to show: it may quote the URL with its userinfo.
pub(super) fn sanitize(message: &str, url: &str) -> String {
    escape_controls(&redact::message(message, url))
}

/// Checks that `url` may be fetched under `settings`, without any IO.
pub fn check_url(url: &str, settings: &SourceSettings) -> Result<(), SourceError> {
    let invalid = |reason| SourceError::InvalidUrl {
        url: display_url(url),
        reason,
    };
    if url.trim().is_empty() {
        return Err(invalid("it is empty"));
    }
    if url.chars().any(char::is_control) {
        return Err(invalid("it contains control characters"));
    }
    if url.starts_with('-') {
        return Err(invalid("it starts with `-`"));
    }
    let scheme = match url_form(url) {
        UrlForm::Helper(helper) => {
            // Never allowed, so never listed as allowed either.
            let allowed = settings
                .allowed_schemes
                .iter()
                .filter(|s| !s.eq_ignore_ascii_case(helper))
                .cloned()
                .collect();
            return Err(SourceError::SchemeRefused {
                scheme: helper.to_owned(),
                allowed,
            });
        }
        UrlForm::Scheme(scheme) => {
            let parsed = url::Url::parse(url).map_err(|_| invalid("it is not a valid URL"))?;
            let scheme = scheme.to_ascii_lowercase();
            // `url` would read `https:///a` as host `a`; git reads no host.
            let host = split_userinfo(url).map_or("", |(_, _, after)| {
                &after[..after.find(['/', '?', '#']).unwrap_or(after.len())]
            });
            if scheme != "file" && (host.is_empty() || parsed.host_str().is_none_or(str::is_empty))
            {
                return Err(invalid("it has no host"));
            }
            match scheme.as_str() {
                "git+ssh" | "ssh+git" => "ssh".to_owned(),
                _ => scheme,
            }
        }
        UrlForm::ScpLike => "ssh".to_owned(),
        UrlForm::LocalPath => "file".to_owned(),
    };
    if settings
        .allowed_schemes
        .iter()
        .any(|s| s.eq_ignore_ascii_case(&scheme))
    {
        Ok(())
    } else {
        Err(SourceError::SchemeRefused {
            scheme,
            allowed: settings.allowed_schemes.clone(),
        })
    }
}

/// The directory a local path or `file://` URL names, if `url` is one.
fn local_path(url: &str) -> Option<PathBuf> {
    match url_form(url) {
        UrlForm::LocalPath => Some(PathBuf::from(url)),
        UrlForm::Scheme(scheme) if scheme.eq_ignore_ascii_case("file") => {
            url::Url::parse(url).ok()?.to_file_path().ok()
        }
        _ => None,
    }
}

/// A local source must be a directory that exists: libgit2 would otherwise
/// answer "unsupported URL protocol". Remote URLs pass unchecked.
pub fn check_local(url: &str) -> Result<(), SourceError> {
    let Some(path) = local_path(url) else {
        return Ok(());
    };
    let reason = match std::fs::metadata(&path) {
        Ok(meta) if meta.is_dir() => return Ok(()),
        Ok(_) => "it is not a directory".to_owned(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => "it does not exist".to_owned(),
        Err(e) => format!("it cannot be read: {e}"),
    };
    Err(SourceError::NoLocalRepository { path, reason })
}

pub(super) fn check_reference(reference: &str) -> Result<(), SourceError> {
    let invalid = |reason| SourceError::InvalidReference {
        reference: escape_controls(reference),
        reason,
    };
    if reference
        .chars()
        .any(|c| c.is_control() || c.is_whitespace())
    {
        return Err(invalid("it contains whitespace or control characters"));
    }
    if reference.starts_with('-') {
        return Err(invalid("it starts with `-`"));
    }
    if reference.len() > 255 {
        return Err(invalid("it is longer than 255 bytes"));
    }
    Ok(())
}
