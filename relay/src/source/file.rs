//! `file:PATH`: replays a record-marked dump of core's stream once, paced like core.
//!
//! The dump may be plain or zstd-compressed (`open_stream` sniffs the magic). A reader thread
//! parses records ahead of emission, up to [`READ_AHEAD`] ledgers, so disk and decompression
//! time never shows in the emission timings; the source thread paces them with [`Pacer`]:
//! ledger k starts at `t0 + k * cadence` (`t0` = when the first ledger is ready) and is emitted
//! over the `emit` window in [`piece_sizes`](super::piece_sizes) pieces.
//!
//! A dump that ends inside a record, or holds a malformed one, fails the source after the
//! records before the damage have been emitted: a replay of a damaged file is an error the
//! operator should see, and the damaged record was never begun, so there is nothing to abort.

use std::fs::File;
use std::path::Path;
use std::sync::mpsc;

use bytes::Bytes;
use ledger_relay_wire::record::{open_stream, ReadError, Records};

use super::{Out, Pacer, SourceOptions, Stop};

/// Ledgers parsed ahead of emission. Bounded so that a long dump is not held in memory whole:
/// four 14.5 MiB ledgers are 58 MiB.
const READ_AHEAD: usize = 4;

pub(super) fn run(path: &Path, opts: &SourceOptions, out: &Out) -> Result<(), Stop> {
    let file = File::open(path)
        .map_err(|e| Stop::Failed(format!("cannot open {}: {e}", path.display())))?;
    let (tx, rx) = mpsc::sync_channel::<Result<Vec<u8>, String>>(READ_AHEAD);
    let max_len = opts.max_record_len;
    let shown = path.display().to_string();
    let reader = std::thread::Builder::new()
        .name("source-file-read".to_owned())
        .spawn(move || {
            // `open_stream` reads the first bytes; its reader is not `Send`, so it is made here.
            let stream = match open_stream(file) {
                Ok(stream) => stream,
                Err(e) => {
                    let _ = tx.send(Err(format!("cannot read {shown}: {e}")));
                    return;
                }
            };
            for record in Records::new(stream, max_len) {
                let record = record.map_err(|e| format!("{shown}: {}", describe(&e)));
                // The source thread is gone (shutdown): stop reading.
                if tx.send(record).is_err() {
                    break;
                }
            }
        })
        .map_err(|e| Stop::Failed(format!("cannot start the file reader thread: {e}")))?;

    let mut pacer = Pacer::new(opts.cadence, opts.emit);
    let result = (|| {
        while let Some(record) = out.recv(&rx)? {
            let body = record.map_err(Stop::Failed)?;
            pacer.emit(out, Bytes::from(body))?;
        }
        Ok(())
    })();
    // Unblocks the reader if it is waiting to send, so it ends after at most one more record.
    drop(rx);
    let _ = reader.join();
    result
}

/// One-line description of a read error, with its cause.
fn describe(e: &ReadError) -> String {
    match e {
        ReadError::Io(io) => format!("{e}: {io}"),
        _ => e.to_string(),
    }
}
