import Foundation

/// `Sun, 22 Nov 2026 06:48:00 GMT` (RFC 1123), for HTTP headers and checkpoint histories.
public func httpDate(_ date: Date) -> String {
    var time = time_t(date.timeIntervalSince1970)
    var parts = tm()
    gmtime_r(&time, &parts)
    var buffer = [Int8](repeating: 0, count: 64)
    let count = strftime(&buffer, buffer.count, "%a, %d %b %Y %H:%M:%S GMT", &parts)
    return String(decoding: buffer[..<count].map { UInt8(bitPattern: $0) }, as: UTF8.self)
}

/// A document id or attachment name as one URL path segment: every byte but ASCII
/// letters, digits and `-._~` percent-encoded, `/` included (CouchDB's style).
public func percentEncodedPathSegment(_ segment: String) -> String {
    var result = ""
    for byte in segment.utf8 {
        let scalar = Unicode.Scalar(byte)
        if byte < 0x80 && (scalar.properties.isAlphabetic || ("0"..."9").contains(scalar) || "-._~".unicodeScalars.contains(scalar)) {
            result.unicodeScalars.append(scalar)
        } else {
            result += String(format: "%%%02X", byte)
        }
    }
    return result
}
