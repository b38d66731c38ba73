//! Makes grpc-core clients work on the registry socket without options.
//!
//! A grpc-core client (Python grpcio, C++, Ruby, C#, PHP…) dialling
//! `unix:///<data-dir>/registry.sock` sends the socket path, %-encoded, as the
//! HTTP/2 `:authority` (`srv%2Fcorbel%2Fregistry.sock`). A `%` outside userinfo
//! is not a valid authority, and h2 (under hyper and tonic) answers such a
//! request with `RST_STREAM` (`PROTOCOL_ERROR`), before any service sees it;
//! h2 has no option to relax that. So every connection accepted on the
//! registry socket is read through [`AuthorityFix`]: each request's header
//! block is scanned, and an `:authority` literal that is not a valid authority
//! has its invalid bytes replaced by `_` (same length) before h2 reads it.
//! The authority means nothing on a unix socket; the registry never reads it.
//!
//! Why same length: HPACK's dynamic table is shared state between the
//! client's encoder and h2's decoder, and an entry's size is its name and value
//! lengths. A value of the same length keeps both tables in step, so later
//! requests that refer to the entry by index see the rewritten value. The
//! value is written back as a plain (not Huffman) string, and the block
//! re-framed as HEADERS + CONTINUATION frames of at most 16,384 bytes (the
//! smallest frame size a peer must accept).
//!
//! Everything else passes through untouched: other frames are copied as they
//! arrive, header blocks without a bad authority are sent as they were, and a
//! block this module cannot read (malformed, over 1 MiB) is sent as it was,
//! for h2 to judge. Only the client-to-server direction is read; writes go
//! straight to the socket.

mod huffman_table;

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::UnixStream;
use tonic::transport::server::{Connected, UdsConnectInfo};

const PREFACE_LEN: usize = 24;
const FRAME_HEADER_LEN: usize = 9;
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The smallest SETTINGS_MAX_FRAME_SIZE: every peer accepts frames this large.
const MAX_FRAME: usize = 16_384;
/// A header block larger than this is passed on unread: h2 refuses header
/// lists well below it (16 KiB by default), so nothing is lost, and a peer
/// cannot make a connection hold more.
const MAX_BLOCK: usize = 64 * 1024;
/// A header name literal longer than this cannot be `:authority` (10 bytes
/// plain, 8 Huffman-coded): it is skipped, not decoded.
const MAX_AUTHORITY_NAME: usize = 16;

/// A registry connection whose requests' `:authority` h2 will accept.
pub struct AuthorityFix<IO> {
    inner: IO,
    /// Bytes read from the socket and not yet handled.
    input: Vec<u8>,
    /// Bytes ready for h2.
    output: Vec<u8>,
    /// How much of `output` h2 has taken.
    taken: usize,
    state: State,
    eof: bool,
}

enum State {
    Preface,
    /// Between frames.
    Frame,
    /// Inside a frame that is copied as it arrives: this many bytes remain.
    Copy(usize),
    /// Inside a header block: the frames so far, as they came, and the block.
    Headers(Pending),
    /// Something this module does not follow: copy everything.
    Through,
}

struct Pending {
    raw: Vec<u8>,
    flags: u8,
    stream: [u8; 4],
    priority: Option<[u8; 5]>,
    block: Vec<u8>,
}

impl<IO> AuthorityFix<IO> {
    pub fn new(inner: IO) -> Self {
        Self {
            inner,
            input: Vec::new(),
            output: Vec::new(),
            taken: 0,
            state: State::Preface,
            eof: false,
        }
    }

    /// Moves what can be handled from `input` to `output`.
    fn process(&mut self) {
        loop {
            let progressed = match &mut self.state {
                State::Through => {
                    self.output.append(&mut self.input);
                    false
                }
                State::Preface => {
                    if self.input.len() < PREFACE_LEN {
                        false
                    } else {
                        self.output.extend(self.input.drain(..PREFACE_LEN));
                        self.state = State::Frame;
                        true
                    }
                }
                State::Copy(left) => {
                    let n = (*left).min(self.input.len());
                    self.output.extend(self.input.drain(..n));
                    *left -= n;
                    if *left == 0 {
                        // Done with this frame (an empty one included).
                        self.state = State::Frame;
                        true
                    } else {
                        false
                    }
                }
                State::Frame | State::Headers(_) => self.frame(),
            };
            if !progressed {
                return;
            }
        }
    }

    /// Handles one whole frame at the start of `input`, if there is one.
    fn frame(&mut self) -> bool {
        if self.input.len() < FRAME_HEADER_LEN {
            return false;
        }
        let len = usize::from(self.input[0]) << 16
            | usize::from(self.input[1]) << 8
            | usize::from(self.input[2]);
        let kind = self.input[3];
        let in_headers = matches!(self.state, State::Headers(_));
        if !in_headers && kind != HEADERS {
            self.output.extend(self.input.drain(..FRAME_HEADER_LEN));
            self.state = State::Copy(len);
            return true;
        }
        if (in_headers && kind != CONTINUATION) || len > MAX_BLOCK {
            // Not a header block this module can follow: h2 will judge it.
            self.give_up();
            return true;
        }
        if self.input.len() < FRAME_HEADER_LEN + len {
            return false;
        }
        let frame: Vec<u8> = self.input.drain(..FRAME_HEADER_LEN + len).collect();
        let flags = frame[4];
        let mut pending = match std::mem::replace(&mut self.state, State::Frame) {
            State::Headers(pending) => pending,
            _ => Pending {
                raw: Vec::new(),
                flags,
                stream: [frame[5], frame[6], frame[7], frame[8]],
                priority: None,
                block: Vec::new(),
            },
        };
        pending.raw.extend_from_slice(&frame);
        let mut payload = &frame[FRAME_HEADER_LEN..];
        if kind == HEADERS {
            if flags & PADDED != 0 {
                let Some((&pad, rest)) = payload.split_first() else {
                    return self.abandon(pending);
                };
                let Some(end) = rest.len().checked_sub(usize::from(pad)) else {
                    return self.abandon(pending);
                };
                payload = &rest[..end];
            }
            if flags & PRIORITY != 0 {
                let Some((priority, rest)) = payload.split_first_chunk::<5>() else {
                    return self.abandon(pending);
                };
                pending.priority = Some(*priority);
                payload = rest;
            }
        }
        pending.block.extend_from_slice(payload);
        if pending.raw.len() > MAX_BLOCK {
            return self.abandon(pending);
        }
        if flags & END_HEADERS == 0 {
            self.state = State::Headers(pending);
            return true;
        }
        match rewrite_block(&pending.block) {
            Some(Some(block)) => self.emit(&pending, &block),
            Some(None) | None => self.output.extend_from_slice(&pending.raw),
        }
        self.state = State::Frame;
        true
    }

    /// Sends a header block already read as it came, and follows no more.
    fn abandon(&mut self, pending: Pending) -> bool {
        self.output.extend_from_slice(&pending.raw);
        self.give_up();
        true
    }

    fn give_up(&mut self) {
        if let State::Headers(pending) = std::mem::replace(&mut self.state, State::Through) {
            self.output.extend_from_slice(&pending.raw);
        }
    }

    /// Writes a rewritten block as HEADERS and CONTINUATION frames.
    fn emit(&mut self, pending: &Pending, block: &[u8]) {
        let first_room = MAX_FRAME - if pending.priority.is_some() { 5 } else { 0 };
        let mut rest = block;
        let mut first = true;
        loop {
            let room = if first { first_room } else { MAX_FRAME };
            let (chunk, after) = rest.split_at(rest.len().min(room));
            let last = after.is_empty();
            let mut flags = if last { END_HEADERS } else { 0 };
            let kind = if first {
                flags |= pending.flags & (END_STREAM | PRIORITY);
                HEADERS
            } else {
                CONTINUATION
            };
            let priority = if first { pending.priority } else { None };
            let len = chunk.len() + priority.map_or(0, |p| p.len());
            self.output
                .extend_from_slice(&(len as u32).to_be_bytes()[1..]);
            self.output.push(kind);
            self.output.push(flags);
            self.output.extend_from_slice(&pending.stream);
            if let Some(p) = priority {
                self.output.extend_from_slice(&p);
            }
            self.output.extend_from_slice(chunk);
            rest = after;
            first = false;
            if last {
                return;
            }
        }
    }
}

/// The block with any invalid `:authority` literal made valid; `Some(None)`
/// when nothing needed it, `None` when the block cannot be read.
fn rewrite_block(block: &[u8]) -> Option<Option<Vec<u8>>> {
    let mut out = Vec::with_capacity(block.len() + 32);
    let mut changed = false;
    let mut at = 0;
    while at < block.len() {
        let start = at;
        let first = block[at];
        let prefix = match first {
            b if b & 0x80 != 0 => {
                // Indexed field: refers to the table, which stays in step.
                let (_, n) = integer(&block[at..], 7)?;
                at += n;
                out.extend_from_slice(&block[start..at]);
                continue;
            }
            b if b & 0xc0 == 0x40 => 6,
            b if b & 0xe0 == 0x20 => {
                let (_, n) = integer(&block[at..], 5)?;
                at += n;
                out.extend_from_slice(&block[start..at]);
                continue;
            }
            _ => 4,
        };
        let (index, n) = integer(&block[at..], prefix)?;
        at += n;
        let is_authority = if index == 0 {
            let (name, n) = string(&block[at..], |len| len <= MAX_AUTHORITY_NAME)?;
            at += n;
            name.as_deref() == Some(b":authority".as_slice())
        } else {
            // Static table entry 1 is `:authority`.
            index == 1
        };
        let value_at = at;
        // Only an `:authority` value is decoded; others are skipped by length.
        let (value, n) = string(&block[at..], |_| is_authority)?;
        at += n;
        if let Some(value) = value
            && http::uri::Authority::try_from(value.as_slice()).is_err()
        {
            out.extend_from_slice(&block[start..value_at]);
            let fixed: Vec<u8> = value
                .iter()
                .map(|&b| {
                    if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
                        b
                    } else {
                        b'_'
                    }
                })
                .collect();
            put_integer(&mut out, 0x00, 7, fixed.len());
            out.extend_from_slice(&fixed);
            changed = true;
        } else {
            out.extend_from_slice(&block[start..at]);
        }
    }
    Some(changed.then_some(out))
}

/// An HPACK integer with an `n`-bit prefix (RFC 7541 §5.1), and its length.
fn integer(src: &[u8], n: u32) -> Option<(usize, usize)> {
    let max = (1usize << n) - 1;
    let mut value = usize::from(*src.first()?) & max;
    if value < max {
        return Some((value, 1));
    }
    let mut shift = 0;
    for (i, &b) in src.iter().enumerate().skip(1) {
        if shift > 28 {
            return None;
        }
        value += usize::from(b & 0x7f) << shift;
        shift += 7;
        if b & 0x80 == 0 {
            return Some((value, i + 1));
        }
    }
    None
}

fn put_integer(out: &mut Vec<u8>, high: u8, n: u32, mut value: usize) {
    let max = (1usize << n) - 1;
    if value < max {
        out.push(high | value as u8);
        return;
    }
    out.push(high | max as u8);
    value -= max;
    while value >= 0x80 {
        out.push((value & 0x7f) as u8 | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// An HPACK string literal (RFC 7541 §5.2) and its encoded length; decoded
/// only when `decode` says so for its encoded length (else `None`).
fn string(src: &[u8], decode: impl Fn(usize) -> bool) -> Option<(Option<Vec<u8>>, usize)> {
    let huffman = *src.first()? & 0x80 != 0;
    let (len, n) = integer(src, 7)?;
    let bytes = src.get(n..n.checked_add(len)?)?;
    let value = match (decode(len), huffman) {
        (false, _) => None,
        (true, true) => Some(huffman_decode(bytes)?),
        (true, false) => Some(bytes.to_vec()),
    };
    Some((value, n + len))
}

/// Decodes the Huffman code bit by bit: only `:authority` values (short) and
/// names are decoded here, once per request on the registry socket.
fn huffman_decode(src: &[u8]) -> Option<Vec<u8>> {
    use huffman_table::{ENCODE_CODE_LENGTHS, ENCODE_CODES};
    let mut out = Vec::with_capacity(src.len() * 8 / 5);
    let mut code: u32 = 0;
    let mut bits: u8 = 0;
    for &byte in src {
        for shift in (0..8).rev() {
            code = code << 1 | u32::from(byte >> shift & 1);
            bits += 1;
            if bits > 30 {
                return None; // no code is longer: EOS or garbage
            }
            if bits >= 5
                && let Some(symbol) =
                    (0..256).find(|&s| ENCODE_CODE_LENGTHS[s] == bits && ENCODE_CODES[s] == code)
            {
                out.push(symbol as u8);
                code = 0;
                bits = 0;
            }
        }
    }
    // What is left must be padding: fewer than 8 bits, all ones.
    (bits < 8 && code == (1u32 << bits) - 1).then_some(out)
}

impl<IO: AsyncRead + Unpin> AsyncRead for AuthorityFix<IO> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        loop {
            if this.taken < this.output.len() {
                let ready = &this.output[this.taken..];
                let n = ready.len().min(buf.remaining());
                buf.put_slice(&ready[..n]);
                this.taken += n;
                if this.taken == this.output.len() {
                    this.output.clear();
                    this.taken = 0;
                }
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                // A connection cut mid-frame: what is left goes to h2 as it is.
                if this.input.is_empty() {
                    return Poll::Ready(Ok(()));
                }
                this.give_up();
                this.process();
                continue;
            }
            let mut chunk = [0u8; 8192];
            let mut read = ReadBuf::new(&mut chunk);
            match Pin::new(&mut this.inner).poll_read(cx, &mut read) {
                Poll::Ready(Ok(())) => {
                    if read.filled().is_empty() {
                        this.eof = true;
                    } else {
                        this.input.extend_from_slice(read.filled());
                        this.process();
                    }
                }
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for AuthorityFix<IO> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// The registry reads the peer's credentials through the wrapper.
impl Connected for AuthorityFix<UnixStream> {
    type ConnectInfo = UdsConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A HEADERS frame of one block, as a client would send it.
    fn headers(block: &[u8], flags: u8) -> Vec<u8> {
        let mut frame = (block.len() as u32).to_be_bytes()[1..].to_vec();
        frame.extend([HEADERS, flags | END_HEADERS, 0, 0, 0, 1]);
        frame.extend_from_slice(block);
        frame
    }

    fn run(bytes: &[u8]) -> Vec<u8> {
        let mut fix = AuthorityFix::new(());
        fix.input.extend_from_slice(bytes);
        fix.process();
        fix.output
    }

    const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

    #[test]
    fn a_percent_encoded_authority_is_rewritten_to_the_same_length() {
        // Literal with incremental indexing, name = static 1 (`:authority`),
        // value in plain text, then `:method: POST` (static 3).
        let value = b"tmp%2Fx%2Fregistry.sock";
        let mut block = vec![0x41, value.len() as u8];
        block.extend_from_slice(value);
        block.push(0x83);
        let mut input = PREFACE.to_vec();
        input.extend(headers(&block, END_STREAM));
        let out = run(&input);
        let mut want_block = vec![0x41, value.len() as u8];
        want_block.extend_from_slice(b"tmp_2Fx_2Fregistry.sock");
        want_block.push(0x83);
        let mut want = PREFACE.to_vec();
        want.extend(headers(&want_block, END_STREAM));
        assert_eq!(out, want);
    }

    #[test]
    fn a_huffman_encoded_authority_is_decoded_and_rewritten() {
        // "www.example.com" Huffman-coded (RFC 7541 C.4.1) is valid: unchanged.
        let valid = [
            0x41, 0x8c, 0xf1, 0xe3, 0xc2, 0xe5, 0xf2, 0x3a, 0x6b, 0xa0, 0xab, 0x90, 0xf4, 0xff,
        ];
        assert_eq!(rewrite_block(&valid), Some(None));
        assert_eq!(
            huffman_decode(&valid[2..]).as_deref(),
            Some(&b"www.example.com"[..])
        );
    }

    #[test]
    fn other_frames_pass_through_unchanged() {
        let mut input = PREFACE.to_vec();
        input.extend([0, 0, 2, 0x0, 0, 0, 0, 0, 1, 7, 8]); // DATA
        input.extend(headers(&[0x82, 0x86], 0)); // :method GET, :scheme http
        assert_eq!(run(&input), input);
    }

    #[test]
    fn a_block_split_over_continuation_frames_is_rewritten_whole() {
        let value = b"a%2Fb";
        let mut block = vec![0x01, value.len() as u8]; // literal without indexing
        block.extend_from_slice(value);
        let mut input = PREFACE.to_vec();
        input.extend([0, 0, 3, HEADERS, 0, 0, 0, 0, 1]);
        input.extend_from_slice(&block[..3]);
        input.extend([0, 0, 4, CONTINUATION, END_HEADERS, 0, 0, 0, 1]);
        input.extend_from_slice(&block[3..]);
        let mut want = PREFACE.to_vec();
        want.extend(headers(&[0x01, 5, b'a', b'_', b'2', b'F', b'b'], 0));
        assert_eq!(run(&input), want);
    }

    #[test]
    fn empty_frames_do_not_stall_what_follows() {
        let mut input = PREFACE.to_vec();
        input.extend([0, 0, 0, 0x4, 0x1, 0, 0, 0, 0]); // SETTINGS ack, empty
        input.extend([0, 0, 0, 0x4, 0x0, 0, 0, 0, 0]); // SETTINGS, empty
        input.extend(headers(&[0x82], 0));
        assert_eq!(run(&input), input);
    }

    #[test]
    fn integers_round_trip() {
        for value in [0, 30, 31, 127, 128, 1337, 1 << 20] {
            let mut out = Vec::new();
            put_integer(&mut out, 0, 5, value);
            assert_eq!(integer(&out, 5), Some((value, out.len())));
        }
    }
}
