/// Snapshot images: the binary tree image (`TreeImage`), the state machine's image (trees,
/// sessions, onDisconnect queues, leases), and the snapshot file's trailer (`SnapshotFormat`).
///
/// Input: a selector byte (low two bits: tree image, state-machine image, snapshot file, tree
/// image streamed in pieces), then the bytes. For the snapshot file, bit 2 repairs the
/// trailer's checksum first (so that mutations get past it).
///
/// Invariants: an image that loads is written back to an image that loads to the same thing and
/// re-encodes to itself; reading an image whole and streamed in small pieces agree; a trailer
/// found lies inside the file and is the one encoded from its fields.
import BanyanOpLog
import BanyanStateMachine
import BanyanTree
import FuzzSupport

@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzSnapshot(_ data: UnsafePointer<UInt8>?, _ size: Int) -> CInt {
    fuzzEntry(data, size) { selector, input in
        var rest = input
        switch selector & 3 {
        case 0: checkTreeImage(rest)
        case 1: checkMachineImage(rest)
        case 2:
            if selector & 4 != 0 { repairTrailer(&rest) }
            checkSnapshotFile(rest)
        default: checkStreamedImage(rest, piece: Int(selector >> 2) + 1)
        }
    }
}

func checkTreeImage(_ bytes: [UInt8]) {
    guard let tree = try? TreeImage.read(bytes) else { return }
    let image = TreeImage.bytes(tree)
    guard let again = try? TreeImage.read(image) else {
        require(false, "the image of a tree read does not read")
        return
    }
    require(again == tree, "tree image does not round-trip")
    require(TreeImage.bytes(again) == image, "tree image is not stable")
}

func checkStreamedImage(_ bytes: [UInt8], piece: Int) {
    let whole = Result { () throws(TreeError) in try TreeImage.read(bytes) }
    var offset = 0
    let streamed = Result { () throws in
        try TreeImage.read(maxLength: bytes.count) { buffer in
            let n = min(piece, buffer.count, bytes.count - offset)
            for i in 0..<n { buffer[i] = bytes[offset + i] }
            offset += n
            return n
        }
    }
    switch (whole, streamed) {
    case let (.success(a), .success(b)): require(a == b, "streamed and whole reads differ")
    case (.failure, .failure): break
    default: require(false, "streamed and whole reads disagree: \(whole) vs \(streamed)")
    }
}

func checkMachineImage(_ bytes: [UInt8]) {
    guard let machine = try? StateMachine(image: bytes) else { return }
    let image = machine.image()
    guard let again = try? StateMachine(image: image) else {
        require(false, "the image of a loaded state machine does not load")
        return
    }
    require(again.image() == image, "state-machine image is not stable")
    require(again.appliedIndex == machine.appliedIndex && again.sessions == machine.sessions, "state differs after a round trip")
}

func checkSnapshotFile(_ file: [UInt8]) {
    let whole = SnapshotFormat.parse(file)
    if file.count >= 16, let length = SnapshotFormat.trailerBytes(last16: Array(file.suffix(16))), length <= file.count {
        let split = SnapshotFormat.parse(head: Array(file.prefix(8)), tail: Array(file.suffix(length)), fileSize: file.count)
        require(split?.body == whole?.body && split?.trailer == whole?.trailer, "reading the trailer alone disagrees")
    }
    guard let (body, trailer) = whole else { return }
    require(body.lowerBound == SnapshotFormat.header.count && body.upperBound <= file.count, "body \(body) outside the file")
    require(Array(file[body.upperBound...]) == SnapshotFormat.encode(trailer), "the trailer is not the one its fields encode")
}

/// Gives the trailer whose length field is in place the checksum of its fields.
func repairTrailer(_ file: inout [UInt8]) {
    let n = file.count
    guard n >= 16 else { return }
    let lengthAt = n - 16
    let length = (0..<4).reduce(0) { $0 | Int(file[lengthAt + $1]) << (8 * $1) }
    guard length <= lengthAt else { return }
    let crc = CRC32C.checksum(Array(file[(lengthAt - length)..<lengthAt]))
    for i in 0..<4 { file[lengthAt + 4 + i] = UInt8(truncatingIfNeeded: crc >> (8 * UInt32(i))) }
}
