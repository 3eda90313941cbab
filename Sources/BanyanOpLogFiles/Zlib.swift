import CZlib

/// A zlib deflate or inflate stream. The `z_stream` lives at a fixed address (zlib keeps a
/// pointer back to it), allocated here and released in `deinit`.
final class ZlibStream {
    enum Mode {
        case compress(level: Int32)
        case decompress
    }

    private let stream: UnsafeMutablePointer<z_stream>
    private let mode: Mode
    private var finished = false
    /// zlib accepted the stream (its end must then be called once).
    private var started = false

    init(_ mode: Mode) throws(OpLogError) {
        self.mode = mode
        stream = UnsafeMutablePointer<z_stream>.allocate(capacity: 1)
        stream.initialize(to: z_stream())
        let rc: Int32
        switch mode {
        case .compress(let level): rc = deflateInit_(stream, level, zlibVersion(), Int32(MemoryLayout<z_stream>.size))
        case .decompress:
            rc = inflateInit_(stream, zlibVersion(), Int32(MemoryLayout<z_stream>.size))
            // zlib's own Adler-32 of the output is not computed: every reader checks the image
            // against the CRC32C in the snapshot's trailer, which is stronger.
            if rc == Z_OK { _ = inflateValidate(stream, 0) }
        }
        // A class whose initialiser throws once every stored property is set is released like
        // any other instance, so `deinit` frees the stream: freeing it here too would free it twice.
        guard rc == Z_OK else { throw OpLogError(.io, "zlib initialisation failed (code \(rc))") }
        started = true
    }

    deinit {
        if started {
            switch mode {
            case .compress: deflateEnd(stream)
            case .decompress: inflateEnd(stream)
            }
        }
        stream.deinitialize(count: 1)
        stream.deallocate()
    }

    /// Feeds `input` (with `finish` on the last call when compressing) and hands every produced
    /// chunk to `emit`. When decompressing, returns true once the stream's end was reached.
    @discardableResult
    func process(_ input: UnsafeBufferPointer<UInt8>, finish: Bool = false, emit: (UnsafeBufferPointer<UInt8>) throws -> Void) throws -> Bool {
        // zlib counts input in 32 bits: feed at most 1 MiB at a time.
        let slice = 1 << 20
        var start = 0
        repeat {
            let end = Swift.min(input.count, start + slice)
            let last = end == input.count
            let ended = try processSlice(UnsafeBufferPointer(rebasing: input[start..<end]), finish: finish && last, emit: emit)
            if ended {
                // Anything after the end of the stream is not part of it.
                if !last || stream.pointee.avail_in != 0 { throw OpLogError(.corrupt, "data after the end of the zlib stream") }
                return true
            }
            start = end
        } while start < input.count
        return false
    }

    /// Decompressing, pull style: the compressed bytes `inflateSome(into:)` reads next. They must
    /// stay valid (and unchanged) until `pendingInput` is 0; at most 4 GiB at a time.
    func setInput(_ input: UnsafeBufferPointer<UInt8>) {
        stream.pointee.next_in = UnsafeMutablePointer(mutating: input.baseAddress)
        stream.pointee.avail_in = UInt32(input.count)
    }

    /// Compressed bytes given to `setInput` that zlib has not read yet.
    var pendingInput: Int { Int(stream.pointee.avail_in) }

    /// Decompressing, pull style: inflates the pending input into `output` until the output is
    /// full, the input runs out, or the stream ends. Returns how many bytes it wrote and whether
    /// the stream has ended.
    func inflateSome(into output: UnsafeMutableBufferPointer<UInt8>) throws(OpLogError) -> (count: Int, ended: Bool) {
        guard !finished else { return (0, true) }
        stream.pointee.next_out = output.baseAddress
        stream.pointee.avail_out = UInt32(truncatingIfNeeded: Swift.min(output.count, Int(UInt32.max)))
        let available = Int(stream.pointee.avail_out)
        let rc = inflate(stream, Z_NO_FLUSH)
        let produced = available - Int(stream.pointee.avail_out)
        switch rc {
        case Z_STREAM_END:
            finished = true
            return (produced, true)
        case Z_OK:
            return (produced, false)
        case Z_BUF_ERROR where stream.pointee.avail_in == 0 || stream.pointee.avail_out == 0:
            // No progress without more input (or more room): not an error by itself.
            return (produced, false)
        default:
            throw OpLogError(.corrupt, "zlib stream is damaged (code \(rc))")
        }
    }

    private func processSlice(_ input: UnsafeBufferPointer<UInt8>, finish: Bool, emit: (UnsafeBufferPointer<UInt8>) throws -> Void) throws -> Bool {
        var output = [UInt8](repeating: 0, count: 256 * 1024)
        stream.pointee.next_in = UnsafeMutablePointer(mutating: input.baseAddress)
        stream.pointee.avail_in = UInt32(input.count)
        while true {
            let (rc, produced) = output.withUnsafeMutableBufferPointer { out -> (Int32, Int) in
                stream.pointee.next_out = out.baseAddress
                stream.pointee.avail_out = UInt32(out.count)
                let rc: Int32
                switch mode {
                case .compress: rc = deflate(stream, finish ? Z_FINISH : Z_NO_FLUSH)
                case .decompress: rc = inflate(stream, Z_NO_FLUSH)
                }
                return (rc, out.count - Int(stream.pointee.avail_out))
            }
            if produced > 0 { try output.withUnsafeBufferPointer { try emit(UnsafeBufferPointer(rebasing: $0[0..<produced])) } }
            switch rc {
            case Z_STREAM_END:
                finished = true
                return true
            case Z_OK:
                if stream.pointee.avail_in == 0 && stream.pointee.avail_out != 0 && !finish { return false }
            case Z_BUF_ERROR:
                // No progress possible: all input consumed and nothing more to flush.
                if stream.pointee.avail_in == 0 { return finished }
                throw OpLogError(.corrupt, "zlib could not make progress")
            default:
                throw OpLogError(.corrupt, "zlib stream is damaged (code \(rc))")
            }
        }
    }
}
