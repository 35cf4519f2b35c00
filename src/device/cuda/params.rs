//! How many parameters a kernel has, read from the image we loaded it from — so the parameter
//! layout can be asked of the driver index by index (`cuFuncGetParamInfo`) without probing one
//! index past the last, which fails with `CUDA_ERROR_INVALID_VALUE` and shows up as an error in
//! every program run under compute-sanitizer.
//!
//! Drivers of CUDA 13.2 and later answer the count themselves (`cuFuncGetParamCount`, looked up
//! by `probe::optional_driver_symbol`); older ones do not, so the count comes from the image:
//!
//! - **PTX** (our own text, or NVRTC's when it targets a virtual architecture): the kernel's
//!   `.entry name(.param ..., .param ...)` declaration lists every parameter, used or not.
//! - **ELF cubin** (NVRTC's usual output, or a cubin the program hands us): the kernel's
//!   `.nv.info.<name>` section holds one `EIATTR_KPARAM_INFO` record per parameter (ordinal,
//!   offset, size) — the records the driver's own answer comes from — or, from newer compilers,
//!   `EIATTR_KPARAM_INFO_V2`. The parameter bank's size (`EIATTR_CBANK_PARAM_SIZE` /
//!   `EIATTR_PARAM_CBANK`) cross-checks them: records for a parameter bank of zero bytes, or no
//!   records for a non-empty one, mean a format we do not know, and we give no answer.
//! - **fatbin**: the first uncompressed ELF or PTX entry that names the kernel (every entry is
//!   the same source, so they agree on parameters); compressed entries are skipped.
//!
//! Anything else, or any malformed input, gives `None`: launches of that kernel are then not
//! checked against its signature, and no driver call fails.
//!
//! Pure byte parsing, no driver: tested on the host with NVRTC-compiled fixtures (`testdata/`).

/// The image a module was loaded from, kept to answer parameter counts of its kernels.
pub(super) enum KernelImage {
    /// PTX text (a terminating NUL is allowed).
    Ptx(Box<[u8]>),
    /// What the program passed as a cubin: an ELF, a fatbin, or PTX text.
    Binary(Box<[u8]>),
}

impl KernelImage {
    /// The number of parameters of kernel `name`, or `None` if the image does not say.
    pub(super) fn param_count(&self, name: &str) -> Option<usize> {
        match self {
            KernelImage::Ptx(text) => ptx_param_count(text, name),
            KernelImage::Binary(bytes) => binary_param_count(bytes, name),
        }
    }
}

const ELF_MAGIC: &[u8] = b"\x7fELF";
const FATBIN_MAGIC: u32 = 0xBA55_ED50;

/// An ELF cubin, a fatbin, or (as the driver reads anything else) PTX text.
pub(super) fn binary_param_count(bytes: &[u8], name: &str) -> Option<usize> {
    if bytes.starts_with(ELF_MAGIC) {
        elf_param_count(bytes, name)
    } else if read_u32(bytes, 0) == Some(FATBIN_MAGIC) {
        fatbin_param_count(bytes, name)
    } else {
        ptx_param_count(bytes, name)
    }
}

fn read_u16(b: &[u8], at: usize) -> Option<u16> {
    let s = b.get(at..at.checked_add(2)?)?;
    Some(u16::from_le_bytes([s[0], s[1]]))
}

fn read_u32(b: &[u8], at: usize) -> Option<u32> {
    let s = b.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes([s[0], s[1], s[2], s[3]]))
}

fn read_u64(b: &[u8], at: usize) -> Option<u64> {
    let s = b.get(at..at.checked_add(8)?)?;
    let mut a = [0u8; 8];
    a.copy_from_slice(s);
    Some(u64::from_le_bytes(a))
}

fn to_usize(v: u64) -> Option<usize> {
    usize::try_from(v).ok()
}

// ---------------------------------------------------------------------------------------------
// PTX

/// PTX with comments removed (string literals, as in `.file 1 "a//b.cu"`, kept whole).
fn strip_ptx_comments(text: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        match text[i] {
            0 => break,
            b'"' => {
                let end = text[i + 1..]
                    .iter()
                    .position(|&c| c == b'"' || c == b'\n')
                    .map_or(text.len(), |p| i + 1 + p + 1);
                out.extend_from_slice(&text[i..end.min(text.len())]);
                i = end;
            }
            b'/' if text.get(i + 1) == Some(&b'/') => {
                while i < text.len() && text[i] != b'\n' {
                    i += 1;
                }
            }
            b'/' if text.get(i + 1) == Some(&b'*') => {
                i += 2;
                while i < text.len() && !(text[i] == b'*' && text.get(i + 1) == Some(&b'/')) {
                    i += 1;
                }
                i += 2;
                out.push(b' ');
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    out
}

/// PTX tokens: words (directives, identifiers, numbers: `[A-Za-z0-9_$%.]+`) and single
/// punctuation characters; whitespace separates.
fn ptx_tokens(text: &[u8]) -> Vec<&[u8]> {
    let word = |c: u8| c.is_ascii_alphanumeric() || matches!(c, b'_' | b'$' | b'%' | b'.');
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < text.len() {
        let c = text[i];
        if c.is_ascii_whitespace() {
            i += 1;
        } else if word(c) {
            let start = i;
            while i < text.len() && word(text[i]) {
                i += 1;
            }
            tokens.push(&text[start..i]);
        } else {
            tokens.push(&text[i..i + 1]);
            i += 1;
        }
    }
    tokens
}

/// The number of parameters of `.entry name` in PTX text: the `.param` declarations of its
/// parameter list (none when the list is empty or absent).
pub(super) fn ptx_param_count(text: &[u8], name: &str) -> Option<usize> {
    let clean = strip_ptx_comments(text);
    let tokens = ptx_tokens(&clean);
    let at = tokens
        .windows(2)
        .position(|w| w[0] == b".entry" && w[1] == name.as_bytes())?;
    let rest = &tokens[at + 2..];
    if rest.first() != Some(&&b"("[..]) {
        // `.entry name` then performance directives or the body: no parameters.
        return Some(0);
    }
    let mut depth = 0usize;
    let mut count = 0usize;
    // Does the current comma-separated item declare a parameter?
    let mut item_is_param = false;
    for &t in &rest[1..] {
        match t {
            b"(" | b"[" => depth += 1,
            b"]" => depth = depth.checked_sub(1)?,
            b")" if depth == 0 => {
                // `()` is an empty list; `(a,)` is not a list we understand.
                return (item_is_param || count == 0).then_some(count + usize::from(item_is_param));
            }
            b")" => depth -= 1,
            b"," if depth == 0 => {
                if !item_is_param {
                    return None; // an empty or unknown item: not a list we understand
                }
                count += 1;
                item_is_param = false;
            }
            b".param" if depth == 0 => item_is_param = true,
            b"{" | b"}" | b";" => return None, // ran past the list: malformed
            _ => {}
        }
    }
    None
}

// ---------------------------------------------------------------------------------------------
// ELF cubin

/// `.nv.info.*` attribute formats (`EIFMT_*`): all but `SVAL` are 4 bytes in all.
const EIFMT_SVAL: u8 = 0x04;
/// `.nv.info.*` attributes (`EIATTR_*`) we read.
const EIATTR_PARAM_CBANK: u8 = 0x0a;
const EIATTR_KPARAM_INFO: u8 = 0x17;
const EIATTR_CBANK_PARAM_SIZE: u8 = 0x19;
const EIATTR_KPARAM_INFO_V2: u8 = 0x45;

/// One parameter as an `EIATTR_KPARAM_INFO(_V2)` record describes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct KParam {
    pub(super) ordinal: u16,
    pub(super) offset: u16,
    pub(super) size: u32,
}

/// The section of a 64-bit little-endian ELF named `name`: its bytes.
fn elf_section<'a>(elf: &'a [u8], name: &[u8]) -> Option<&'a [u8]> {
    // e_ident: class 2 (64-bit), data 1 (little-endian).
    if !elf.starts_with(ELF_MAGIC) || elf.get(4) != Some(&2) || elf.get(5) != Some(&1) {
        return None;
    }
    let shoff = to_usize(read_u64(elf, 0x28)?)?;
    let shentsize = usize::from(read_u16(elf, 0x3a)?);
    let shnum = usize::from(read_u16(elf, 0x3c)?);
    let shstrndx = usize::from(read_u16(elf, 0x3e)?);
    if shentsize < 0x40 || shstrndx >= shnum {
        return None;
    }
    let header = |i: usize| -> Option<(usize, &'a [u8])> {
        let h = shoff.checked_add(i.checked_mul(shentsize)?)?;
        let name = read_u32(elf, h)? as usize;
        let offset = to_usize(read_u64(elf, h + 0x18)?)?;
        let size = to_usize(read_u64(elf, h + 0x20)?)?;
        let sh_type = read_u32(elf, h + 4)?;
        // SHT_NOBITS (8) has no bytes in the file.
        let bytes = if sh_type == 8 {
            &[][..]
        } else {
            elf.get(offset..offset.checked_add(size)?)?
        };
        Some((name, bytes))
    };
    let (_, strtab) = header(shstrndx)?;
    for i in 0..shnum {
        let (name_at, bytes) = header(i)?;
        let s = strtab.get(name_at..)?;
        let s = &s[..s.iter().position(|&c| c == 0)?];
        if s == name {
            return Some(bytes);
        }
    }
    None
}

/// The parameter records of kernel `name` in an ELF cubin, ordered by ordinal, or `None` when
/// the cubin has no (understandable) information on it. See the module comment.
pub(super) fn elf_kparams(elf: &[u8], name: &str) -> Option<Vec<KParam>> {
    let mut section = b".nv.info.".to_vec();
    section.extend_from_slice(name.as_bytes());
    let info = elf_section(elf, &section)?;
    let mut params: Vec<KParam> = Vec::new();
    let mut bank_bytes = 0u32;
    let mut i = 0usize;
    while i < info.len() {
        let format = *info.get(i)?;
        let attribute = *info.get(i + 1)?;
        if format != EIFMT_SVAL {
            if attribute == EIATTR_CBANK_PARAM_SIZE {
                bank_bytes = bank_bytes.max(u32::from(read_u16(info, i + 2)?));
            }
            i += 4;
            continue;
        }
        let len = usize::from(read_u16(info, i + 2)?);
        let value = info.get(i + 4..i + 4 + len)?;
        match attribute {
            // u32 index, u16 ordinal, u16 offset, u32 flags whose top 14 bits are the size.
            EIATTR_KPARAM_INFO if len == 12 => params.push(KParam {
                ordinal: read_u16(value, 4)?,
                offset: read_u16(value, 6)?,
                size: read_u32(value, 8)? >> 18,
            }),
            // u32 index, u16 ordinal, u16 offset, u16 size, ...
            EIATTR_KPARAM_INFO_V2 if len >= 10 => params.push(KParam {
                ordinal: read_u16(value, 4)?,
                offset: read_u16(value, 6)?,
                size: u32::from(read_u16(value, 8)?),
            }),
            EIATTR_KPARAM_INFO | EIATTR_KPARAM_INFO_V2 => return None,
            // u32 symbol, u16 bank offset, u16 bank size.
            EIATTR_PARAM_CBANK if len == 8 => {
                bank_bytes = bank_bytes.max(u32::from(read_u16(value, 6)?));
            }
            _ => {}
        }
        i += 4 + len;
    }
    params.sort_by_key(|p| p.ordinal);
    // Ordinals exactly 0..n, each once, and every parameter inside the bank.
    let ordinals_ok = params
        .iter()
        .enumerate()
        .all(|(k, p)| usize::from(p.ordinal) == k);
    let inside = params
        .iter()
        .all(|p| u32::from(p.offset) + p.size <= bank_bytes);
    let empty_agrees = params.is_empty() == (bank_bytes == 0);
    (ordinals_ok && inside && empty_agrees).then_some(params)
}

pub(super) fn elf_param_count(elf: &[u8], name: &str) -> Option<usize> {
    elf_kparams(elf, name).map(|p| p.len())
}

// ---------------------------------------------------------------------------------------------
// fatbin

/// Entry kinds of a fatbin.
const FATBIN_KIND_PTX: u16 = 1;
const FATBIN_KIND_ELF: u16 = 2;
/// Entry flag: the payload is compressed.
const FATBIN_FLAG_COMPRESS: u64 = 0x2000;

/// The first uncompressed ELF or PTX entry of a fatbin that knows kernel `name`.
///
/// Layout: a header (u32 magic, u16 version, u16 header size, u64 size of the entries), then
/// entries, each a header (u16 kind, u16, u32 header size, u64 payload size, ..., u64 flags at
/// 40, u64 uncompressed size at 56) and its payload.
pub(super) fn fatbin_param_count(fatbin: &[u8], name: &str) -> Option<usize> {
    if read_u32(fatbin, 0)? != FATBIN_MAGIC {
        return None;
    }
    let header = usize::from(read_u16(fatbin, 6)?);
    let end = header
        .checked_add(to_usize(read_u64(fatbin, 8)?)?)?
        .min(fatbin.len());
    let mut at = header;
    while at < end {
        let kind = read_u16(fatbin, at)?;
        let entry_header = read_u32(fatbin, at + 4)? as usize;
        let payload_size = to_usize(read_u64(fatbin, at + 8)?)?;
        let flags = read_u64(fatbin, at + 40).unwrap_or(0);
        let uncompressed = read_u64(fatbin, at + 56).unwrap_or(0);
        if entry_header < 16 {
            return None;
        }
        let start = at.checked_add(entry_header)?;
        let payload = fatbin.get(start..start.checked_add(payload_size)?)?;
        if flags & FATBIN_FLAG_COMPRESS == 0 && uncompressed == 0 {
            let found = match kind {
                FATBIN_KIND_ELF if payload.starts_with(ELF_MAGIC) => elf_param_count(payload, name),
                FATBIN_KIND_PTX => ptx_param_count(payload, name),
                _ => None,
            };
            if found.is_some() {
                return found;
            }
        }
        at = start + payload_size;
    }
    None
}
