//! Reading and writing protocol frames (u32 length prefix, protocol/src/frame.rs)
//! on tokio streams, with the frame size bounded before any allocation and the
//! rest of a started frame bounded in time. Knows nothing of what frames mean.

use std::io;
use std::time::Duration;

use protocol::frame::{self, FrameError, LENGTH_PREFIX_BYTES};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

#[derive(Debug, thiserror::Error)]
pub enum FrameIoError {
    #[error("i/o: {0}")]
    Io(#[from] io::Error),
    #[error("frame: {0}")]
    Frame(#[from] FrameError),
    #[error("frame not complete within {0:?}")]
    Timeout(Duration),
}

/// Reads one frame (without its prefix) into `buf`. `Ok(false)` is a clean end
/// of stream before a frame started. Waiting for a frame to start is unbounded
/// (an idle connection is fine); once its prefix arrived, the whole frame must
/// arrive within `frame_read_timeout`.
pub async fn read_frame<R: AsyncRead + Unpin>(
    reader: &mut R,
    frame_bytes_max: u32,
    frame_read_timeout: Duration,
    buf: &mut Vec<u8>,
) -> Result<bool, FrameIoError> {
    let mut prefix = [0u8; LENGTH_PREFIX_BYTES];
    let first = reader.read(&mut prefix).await?;
    if first == 0 {
        return Ok(false);
    }
    let rest = async {
        reader.read_exact(&mut prefix[first..]).await?;
        let len = frame::frame_len(prefix, frame_bytes_max)?;
        buf.clear();
        buf.resize(len, 0);
        reader.read_exact(buf).await?;
        Ok::<(), FrameIoError>(())
    };
    tokio::time::timeout(frame_read_timeout, rest)
        .await
        .map_err(|_| FrameIoError::Timeout(frame_read_timeout))??;
    Ok(true)
}

/// Writes a whole encoded frame (prefix included) and flushes it.
pub async fn write_frame<W: AsyncWrite + Unpin>(
    writer: &mut W,
    frame: &[u8],
) -> Result<(), FrameIoError> {
    writer.write_all(frame).await?;
    writer.flush().await?;
    Ok(())
}
