//! The web console and GraphiQL: the static files of `web/`, embedded in the
//! binary, so both work with no network beyond this server. The console is one
//! page (`index.html`) served at each of its routes, so reload and back work;
//! its modules, styles and the vendored GraphiQL bundles are under `/ui/`.

use axum::Router;
use axum::body::Bytes;
use axum::extract::Path;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use rust_embed::RustEmbed;

#[derive(RustEmbed)]
#[folder = "web/"]
struct Assets;

/// The console's top-level routes (`web/js/app.js` names the same): each is
/// answered with `index.html`, and so is any path below it.
const SECTIONS: &[&str] = &[
    "sign-in",
    "providers",
    "repositories",
    "elements",
    "blueprints",
    "deployments",
    "projects",
    "users",
    "account",
    "audit",
];

/// Scripts, styles, fonts and connections only from this origin; no framing.
/// GraphiQL's bundles set inline styles, hence `'unsafe-inline'` for styles only.
const CSP: &str = "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; \
                   img-src 'self' data:; font-src 'self' data:; connect-src 'self'; \
                   frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

pub fn router<S: Clone + Send + Sync + 'static>() -> Router<S> {
    let mut router = Router::new()
        .route("/", get(index))
        .route("/favicon.ico", get(favicon))
        .route("/ui/{*path}", get(asset))
        .fallback(not_found);
    for section in SECTIONS {
        router = router
            .route(&format!("/{section}"), get(index))
            .route(&format!("/{section}/{{*rest}}"), get(index));
    }
    router
}

/// GraphiQL, from the vendored bundles (`web/vendor/graphiql/`).
pub async fn graphiql(headers: HeaderMap) -> Response {
    serve("graphiql.html", &headers).await
}

async fn index(headers: HeaderMap) -> Response {
    serve("index.html", &headers).await
}

/// The icon browsers ask for on every page (an SVG: what `index.html` links).
async fn favicon(headers: HeaderMap) -> Response {
    serve("favicon.svg", &headers).await
}

/// Any other path: a browser's page load gets the console (status 404), which
/// says "Not found" with a way back; anything else a plain 404.
async fn not_found(headers: HeaderMap) -> Response {
    let page = headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|accept| accept.contains("text/html"));
    if !page {
        return (StatusCode::NOT_FOUND, "not found\n").into_response();
    }
    let mut response = serve("index.html", &HeaderMap::new()).await;
    if response.status() == StatusCode::OK {
        *response.status_mut() = StatusCode::NOT_FOUND;
    }
    response
}

async fn asset(Path(path): Path<String>, headers: HeaderMap) -> Response {
    serve(&path, &headers).await
}

/// A file of `web/`, revalidated on each use (`no-cache`) by its ETag: an
/// unchanged file is a `304` with no body. Text files go compressed to a
/// client that takes it, brotli or gzip (`Vary: Accept-Encoding`; an ETag
/// of each).
async fn serve(path: &str, request: &HeaderMap) -> Response {
    match Assets::get(path) {
        Some(file) => {
            let mime = mime_guess::from_path(path).first_or_octet_stream();
            let text = compressible(path, file.data.len());
            let packed = match text.then(|| chosen_coding(request)).flatten() {
                Some(coding) => packed(path, coding, &file.data)
                    .await
                    .map(|bytes| (coding, bytes)),
                None => None,
            };
            let etag = format!(
                "\"{}{}\"",
                hex(&file.metadata.sha256_hash()[..12]),
                packed
                    .as_ref()
                    .map_or("", |(coding, _)| coding.etag_suffix())
            );
            let fresh = request
                .get(header::IF_NONE_MATCH)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.split(',').any(|tag| tag.trim() == etag));
            let mut response = if fresh {
                StatusCode::NOT_MODIFIED.into_response()
            } else if let Some((coding, packed)) = packed {
                (
                    [
                        (header::CONTENT_TYPE, mime.as_ref().to_owned()),
                        (header::CONTENT_ENCODING, coding.name().to_owned()),
                    ],
                    packed,
                )
                    .into_response()
            } else {
                (
                    [(header::CONTENT_TYPE, mime.as_ref().to_owned())],
                    file.data.into_owned(),
                )
                    .into_response()
            };
            let headers = response.headers_mut();
            headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
            if text {
                headers.insert(header::VARY, HeaderValue::from_static("accept-encoding"));
            }
            if let Ok(etag) = HeaderValue::from_str(&etag) {
                headers.insert(header::ETAG, etag);
            }
            let headers = response.headers_mut();
            headers.insert(
                header::X_CONTENT_TYPE_OPTIONS,
                HeaderValue::from_static("nosniff"),
            );
            if path.ends_with(".html") {
                headers.insert(
                    header::CONTENT_SECURITY_POLICY,
                    HeaderValue::from_static(CSP),
                );
                headers.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
            }
            response
        }
        None => (StatusCode::NOT_FOUND, "not found\n").into_response(),
    }
}

/// Files worth sending gzipped: text of 1 KiB or more.
fn compressible(path: &str, len: usize) -> bool {
    const TEXT: [&str; 7] = [".js", ".css", ".html", ".svg", ".json", ".md", ".txt"];
    len >= 1024 && TEXT.iter().any(|ext| path.ends_with(ext))
}

/// How a text file can go compressed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Coding {
    Brotli,
    Gzip,
}

impl Coding {
    fn name(self) -> &'static str {
        match self {
            Coding::Brotli => "br",
            Coding::Gzip => "gzip",
        }
    }

    fn etag_suffix(self) -> &'static str {
        match self {
            Coding::Brotli => "-br",
            Coding::Gzip => "-gz",
        }
    }

    /// `data` compressed: brotli at quality 9 (within a few per cent of
    /// its best, ten times faster), gzip at its best.
    fn compress(self, data: &[u8]) -> Option<Vec<u8>> {
        use std::io::Write as _;
        match self {
            Coding::Brotli => {
                let mut out = Vec::with_capacity(data.len() / 3);
                {
                    let mut br = brotli::CompressorWriter::new(&mut out, 64 * 1024, 9, 22);
                    br.write_all(data).ok()?;
                    br.flush().ok()?;
                }
                Some(out)
            }
            Coding::Gzip => {
                let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
                gz.write_all(data).ok()?;
                gz.finish().ok()
            }
        }
    }
}

/// What the request's `Accept-Encoding` takes: brotli before gzip, each
/// named or through `*`, without `q=0` (one named refused is refused
/// whatever `*` says).
fn chosen_coding(request: &HeaderMap) -> Option<Coding> {
    let mut named = [None, None];
    let mut any = false;
    let codings = request
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','));
    for coding in codings {
        let mut parts = coding.split(';').map(str::trim);
        let name = parts.next().unwrap_or_default();
        let taken = !parts.any(|p| {
            p.strip_prefix("q=")
                .and_then(|q| q.parse::<f32>().ok())
                .is_some_and(|q| q == 0.0)
        });
        if name.eq_ignore_ascii_case("br") {
            named[0] = Some(taken);
        } else if name.eq_ignore_ascii_case("gzip") {
            named[1] = Some(taken);
        } else if name == "*" {
            any = taken;
        }
    }
    [Coding::Brotli, Coding::Gzip]
        .into_iter()
        .zip(named)
        .find(|(_, named)| named.unwrap_or(any))
        .map(|(coding, _)| coding)
}

/// `path` compressed with `coding`, made once, off the async workers, at
/// its first request and kept (the files are the binary's: they never
/// change while it runs); `None` if it cannot be made.
async fn packed(path: &str, coding: Coding, data: &[u8]) -> Option<Bytes> {
    use std::collections::HashMap;
    use std::sync::{Arc, Mutex, OnceLock};
    type Packed = Arc<OnceLock<Option<Bytes>>>;
    static MADE: OnceLock<Mutex<HashMap<(String, Coding), Packed>>> = OnceLock::new();
    let packed: Packed = MADE
        .get_or_init(Mutex::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .entry((path.to_owned(), coding))
        .or_default()
        .clone();
    if let Some(done) = packed.get() {
        return done.clone();
    }
    // Requests that come while it is made wait for the one making it.
    let data = data.to_vec();
    tokio::task::spawn_blocking(move || {
        packed
            .get_or_init(|| coding.compress(&data).map(Bytes::from))
            .clone()
    })
    .await
    .ok()
    .flatten()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
