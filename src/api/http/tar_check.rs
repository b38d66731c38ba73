//! An upload's tar archive checked as it streams by, before any of it is
//! sent on: only regular files and directories (no links, devices or
//! fifos), every path relative and without `..` (GNU long names and pax
//! `path` records included), and a proper end. Linear, a block at a time.

/// One 512-byte tar block.
const BLOCK: usize = 512;
/// Most bytes of a long name or a pax header kept to read its path.
const MAX_META: u64 = 64 * 1024;

/// What a header's data holds for us.
enum Data {
    /// File contents: skipped.
    Skip,
    /// A GNU long name (`L`) or a pax header (`x`): read to check the path.
    Meta { pax: bool, kept: Vec<u8> },
}

#[derive(Default)]
pub struct TarCheck {
    /// A block not whole yet.
    partial: Vec<u8>,
    /// Bytes of the current entry's data still to come (padded to blocks).
    data_left: u64,
    /// Its data's own length, before padding.
    data_size: u64,
    data: Option<Data>,
    zero_blocks: u32,
    /// Entries seen (files and directories).
    pub entries: u64,
}

impl TarCheck {
    /// Checks `bytes`, the next part of the archive.
    pub fn feed(&mut self, mut bytes: &[u8]) -> Result<(), String> {
        while !bytes.is_empty() {
            if self.zero_blocks >= 2 {
                return Ok(()); // the end: what follows is padding
            }
            let want = BLOCK - self.partial.len();
            let take = want.min(bytes.len());
            self.partial.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if self.partial.len() == BLOCK {
                let block = std::mem::take(&mut self.partial);
                self.block(&block)?;
            }
        }
        Ok(())
    }

    /// The archive has ended: it must have ended as a tar archive does.
    pub fn finish(&self) -> Result<(), String> {
        if self.zero_blocks >= 1 && self.data_left == 0 && self.partial.is_empty() {
            Ok(())
        } else if self.entries == 0 && self.zero_blocks == 0 {
            Err("the upload is not a tar archive (it is empty)".to_owned())
        } else {
            Err("the tar archive is cut short".to_owned())
        }
    }

    fn block(&mut self, block: &[u8]) -> Result<(), String> {
        if self.data_left > 0 {
            let padded = self.data_size.div_ceil(BLOCK as u64) * BLOCK as u64;
            let offset = padded - self.data_left;
            let useful = self.data_size.saturating_sub(offset).min(BLOCK as u64) as usize;
            if let Some(Data::Meta { kept, .. }) = &mut self.data {
                kept.extend_from_slice(&block[..useful]);
            }
            self.data_left -= BLOCK as u64;
            if self.data_left == 0 {
                self.end_of_data()?;
            }
            return Ok(());
        }
        if block.iter().all(|b| *b == 0) {
            self.zero_blocks += 1;
            return Ok(());
        }
        if self.zero_blocks > 0 {
            return Err("the tar archive has an entry after its end".to_owned());
        }
        self.header(block)
    }

    fn header(&mut self, block: &[u8]) -> Result<(), String> {
        let stored: u32 = octal(&block[148..156]).ok_or("a tar header has no checksum")? as u32;
        let sum: u32 = block
            .iter()
            .enumerate()
            .map(|(i, b)| {
                if (148..156).contains(&i) {
                    32
                } else {
                    u32::from(*b)
                }
            })
            .sum();
        if sum != stored {
            return Err(
                "the upload is not a tar archive (a header's checksum is wrong)".to_owned(),
            );
        }
        let mut name = text(&block[0..100]);
        if &block[257..262] == b"ustar" {
            let prefix = text(&block[345..500]);
            if !prefix.is_empty() {
                name = format!("{prefix}/{name}");
            }
        }
        let size =
            size(&block[124..136]).ok_or_else(|| format!("{name}: its size is not a number"))?;
        let kind = block[156];
        self.data = match kind {
            b'0' | 0 | b'7' => {
                check_path(&name)?;
                self.entries += 1;
                Some(Data::Skip)
            }
            b'5' => {
                check_path(&name)?;
                self.entries += 1;
                Some(Data::Skip)
            }
            b'L' | b'x' if size <= MAX_META => Some(Data::Meta {
                pax: kind == b'x',
                kept: Vec::new(),
            }),
            b'L' | b'x' => return Err(format!("{name}: a long-name header of {size} bytes")),
            b'g' => Some(Data::Skip),
            b'1' => {
                return Err(format!(
                    "{name} is a hard link: only files and directories may be uploaded"
                ));
            }
            b'2' => {
                return Err(format!(
                    "{name} is a symbolic link: only files and directories may be uploaded"
                ));
            }
            b'3' | b'4' => {
                return Err(format!(
                    "{name} is a device: only files and directories may be uploaded"
                ));
            }
            b'6' => {
                return Err(format!(
                    "{name} is a fifo: only files and directories may be uploaded"
                ));
            }
            other => {
                return Err(format!(
                    "{name}: entries of kind {:?} are refused: only files and directories may be uploaded",
                    other as char
                ));
            }
        };
        self.data_size = size;
        self.data_left = size.div_ceil(BLOCK as u64) * BLOCK as u64;
        if self.data_left == 0 {
            self.end_of_data()?;
        }
        Ok(())
    }

    /// The current entry's data is all read: a long name or pax path checked.
    fn end_of_data(&mut self) -> Result<(), String> {
        if let Some(Data::Meta { pax, kept }) = self.data.take() {
            if pax {
                for record in pax_records(&kept) {
                    if let Some(path) = record.strip_prefix("path=") {
                        check_path(path)?;
                    } else if record.starts_with("linkpath=") {
                        return Err(
                            "links are refused: only files and directories may be uploaded"
                                .to_owned(),
                        );
                    }
                }
            } else {
                check_path(&text(&kept))?;
            }
        }
        Ok(())
    }
}

/// A path in an archive: relative, no `..`.
fn check_path(path: &str) -> Result<(), String> {
    if path.starts_with('/') {
        return Err(format!("{path}: absolute paths are refused in an upload"));
    }
    if path.split('/').any(|part| part == "..") {
        return Err(format!("{path}: a path climbing out (`..`) is refused"));
    }
    Ok(())
}

fn text(bytes: &[u8]) -> String {
    let end = bytes.iter().position(|b| *b == 0).unwrap_or(bytes.len());
    String::from_utf8_lossy(&bytes[..end]).into_owned()
}

fn octal(field: &[u8]) -> Option<u64> {
    let text = text(field);
    let digits = text.trim_matches(|c: char| c == ' ' || c == '\0');
    if digits.is_empty() {
        return Some(0);
    }
    u64::from_str_radix(digits, 8).ok()
}

/// A size: octal, or GNU's base-256 for large ones (high bit set).
fn size(field: &[u8]) -> Option<u64> {
    if field[0] & 0x80 != 0 {
        let mut value: u64 = u64::from(field[0] & 0x7f);
        for b in &field[1..] {
            value = value.checked_mul(256)?.checked_add(u64::from(*b))?;
        }
        return Some(value);
    }
    octal(field)
}

/// `len key=value\n` records of a pax header, as `key=value`.
fn pax_records(data: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(data);
    text.lines()
        .filter_map(|line| line.split_once(' ').map(|(_, record)| record.to_owned()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn archive(build: impl FnOnce(&mut tar::Builder<Vec<u8>>)) -> Vec<u8> {
        let mut builder = tar::Builder::new(Vec::new());
        build(&mut builder);
        builder.into_inner().unwrap()
    }

    fn file(builder: &mut tar::Builder<Vec<u8>>, path: &str, body: &[u8]) {
        let mut header = tar::Header::new_gnu();
        header.set_size(body.len() as u64);
        header.set_mode(0o644);
        header.set_entry_type(tar::EntryType::Regular);
        builder.append_data(&mut header, path, body).unwrap();
    }

    fn check(bytes: &[u8], chunk: usize) -> Result<u64, String> {
        let mut check = TarCheck::default();
        for part in bytes.chunks(chunk) {
            check.feed(part)?;
        }
        check.finish()?;
        Ok(check.entries)
    }

    #[test]
    fn files_and_directories_pass_in_any_chunking() {
        let long = format!("deep/{}/file.txt", "d".repeat(150));
        let bytes = archive(|b| {
            let mut dir = tar::Header::new_gnu();
            dir.set_entry_type(tar::EntryType::Directory);
            dir.set_size(0);
            dir.set_mode(0o755);
            b.append_data(&mut dir, "deep/", std::io::empty()).unwrap();
            file(b, "deep/a.txt", &[7u8; 1000]);
            file(b, &long, b"x");
            file(b, "empty", b"");
        });
        for chunk in [1, 511, 512, 513, 4096, bytes.len()] {
            assert_eq!(check(&bytes, chunk), Ok(4), "chunks of {chunk}");
        }
    }

    #[test]
    fn links_climbing_paths_and_cut_archives_are_refused() {
        let link = archive(|b| {
            let mut header = tar::Header::new_gnu();
            header.set_entry_type(tar::EntryType::Symlink);
            header.set_size(0);
            b.append_link(&mut header, "escape", "/etc/passwd").unwrap();
        });
        assert!(check(&link, 512).unwrap_err().contains("symbolic link"));

        // `tar` refuses to write `..`; the header is made by hand.
        let mut header = tar::Header::new_old();
        header.as_old_mut().name[..13].copy_from_slice(b"../outside.sh");
        header.set_size(1);
        header.set_entry_type(tar::EntryType::Regular);
        header.set_cksum();
        let mut climbing = header.as_bytes().to_vec();
        climbing.extend_from_slice(&[b'x'; 512]);
        climbing.extend_from_slice(&[0; 1024]);
        assert!(check(&climbing, 100).unwrap_err().contains("climbing out"));

        let whole = archive(|b| file(b, "a.txt", &[1u8; 2000]));
        assert!(
            check(&whole[..1536], 512)
                .unwrap_err()
                .contains("cut short")
        );
        assert!(check(b"not a tar archive at all", 512).is_err());
        assert!(check(b"", 512).unwrap_err().contains("empty"));
    }
}
