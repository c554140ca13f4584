/// HTTPTransport: HTTP/1.1 on libcurl for talking to remote databases: URLs with their
/// credentials apart (`RemoteDatabase`), a blocking client on one keep-alive connection with
/// retries and cancellation (`HTTPClient`), and the errors a remote can give
/// (`ReplicationError`). What the requests mean (CouchDB's replication protocol) is the
/// Replicator's.

import CCurl
import DocumentModel
import Foundation

/// A remote database URL, split the way replication needs it: credentials apart
/// (never logged, never part of the replication id), default ports explicit.
public struct RemoteDatabase: Sendable, CustomStringConvertible {
    /// `scheme://host:port/path`, no credentials, no trailing slash.
    public let url: String
    public let user: String?
    public let password: String?

    public init(_ text: String, user: String? = nil, password: String? = nil) throws {
        guard var components = URLComponents(string: text), let scheme = components.scheme?.lowercased(),
              ["http", "https", "ws", "wss"].contains(scheme), let host = components.host, !host.isEmpty else {
            throw SofaError.invalidArgument("not an http(s) or ws(s) database URL: \(RemoteDatabase.redacted(text))")
        }
        self.user = user ?? components.user?.removingPercentEncoding
        self.password = password ?? components.password?.removingPercentEncoding
        components.user = nil
        components.password = nil
        components.scheme = scheme
        components.host = host.lowercased()
        components.port = components.port ?? (scheme == "https" || scheme == "wss" ? 443 : 80)
        var path = components.percentEncodedPath
        while path.hasSuffix("/") { path.removeLast() }
        guard !path.isEmpty else { throw SofaError.invalidArgument("the URL names no database: \(RemoteDatabase.redacted(text))") }
        components.percentEncodedPath = path
        components.query = nil
        components.fragment = nil
        url = components.string!
    }

    /// A database file on this machine (a Couchbase Lite `NAME.cblite2`), read in place:
    /// `file://` and its absolute path, so that its replications have ids of their own.
    public init(file path: String) {
        let absolute = path.hasPrefix("/") ? path : FileManager.default.currentDirectoryPath + "/" + path
        var trimmed = absolute
        while trimmed.count > 1, trimmed.hasSuffix("/") { trimmed.removeLast() }
        url = "file://" + trimmed
        (user, password) = (nil, nil)
    }

    /// A database file on this machine (`init(file:)`), its path.
    public var filePath: String? { url.hasPrefix("file://") ? String(url.dropFirst(7)) : nil }

    public var description: String { filePath ?? url }

    /// A Couchbase Lite endpoint (`ws://`, `wss://`): Sync Gateway's or `sofa serve`'s
    /// `_blipsync`, spoken with BLIP rather than CouchDB's HTTP API.
    public var isBLIP: Bool { url.hasPrefix("ws://") || url.hasPrefix("wss://") }

    /// `text` with any `user:password@` removed, for messages.
    public static func redacted(_ text: String) -> String {
        text.replacingOccurrences(of: #"//[^/@]*@"#, with: "//", options: .regularExpression)
    }

    /// The URL of a path under the database (`_changes`, a document id…), already percent-encoded.
    public func url(_ path: String) -> String { path.isEmpty ? url : "\(url)/\(path)" }
}

/// Errors talking to a remote database.
public enum ReplicationError: Error, CustomStringConvertible, Sendable {
    /// Connection refused, reset, timed out, TLS failure…: worth retrying.
    case network(String)
    /// An HTTP error answer.
    case http(status: Int, error: String, reason: String, url: String)
    /// The answer was not what the protocol says.
    case protocolError(String)
    /// Somebody asked to stop (`Cancellation`).
    case cancelled

    public var description: String {
        switch self {
        case .network(let message): "cannot reach the remote database: \(message)"
        case .http(401, _, let reason, let url): "\(url): not authorized (\(reason)); give --user and --password-file, or user:password@ in the URL"
        case .http(403, _, let reason, let url): "\(url): forbidden (\(reason))"
        case .http(let status, let error, let reason, let url): "\(url): HTTP \(status) \(error): \(reason)"
        case .protocolError(let message): "unexpected answer from the remote database: \(message)"
        case .cancelled: "cancelled"
        }
    }

    /// Whether trying again later may succeed.
    public var isTransient: Bool {
        switch self {
        case .network: true
        case .http(let status, _, _, _): status >= 500 || status == 408 || status == 429
        case .protocolError: true
        case .cancelled: false
        }
    }
}

/// Bytes to upload, pulled as curl asks for them.
public protocol UploadSource: AnyObject {
    var length: Int64 { get }
    func read(into buffer: UnsafeMutableRawBufferPointer) throws -> Int
}

public final class BytesUpload: UploadSource {
    private let bytes: [UInt8]
    private var offset = 0
    public init(_ bytes: [UInt8]) { self.bytes = bytes }
    public var length: Int64 { Int64(bytes.count) }
    public func read(into buffer: UnsafeMutableRawBufferPointer) throws -> Int {
        let count = min(buffer.count, bytes.count - offset)
        bytes.withUnsafeBytes { buffer.baseAddress!.copyMemory(from: $0.baseAddress! + offset, byteCount: count) }
        offset += count
        return count
    }
}

/// One HTTP answer. The body is kept unless a sink consumed it.
public struct HTTPAnswer {
    public let status: Int
    /// Lowercased names.
    public let headers: [String: String]
    public let body: [UInt8]

    public init(status: Int, headers: [String: String], body: [UInt8]) {
        self.status = status
        self.headers = headers
        self.body = body
    }

    /// The body as JSON; nil when it is not (the caller says what it expected).
    public var json: JSONValue? { try? JSONParser.parse(body) }
}

/// How transient failures (refused or reset connections, 5xx, stalls, bodies that fail
/// their digest) are retried: exponential backoff, bounded.
public struct RetryPolicy: Sendable {
    /// Tries per operation, the first included.
    public var attempts = HTTPTuning.attempts
    public var initialDelay = HTTPTuning.firstRetryDelay
    public var maximumDelay = HTTPTuning.longestRetryDelay
    /// A request that receives nothing for this long (seconds) fails, and is tried again.
    public var stallTimeout = HTTPTuning.stallTimeout

    public init() {}
}

/// A request to stop transfers in flight (at once, even a stalled one) and the waits between
/// retries; shared by every client made for one job.
public final class Cancellation: @unchecked Sendable {
    // Sendable invariant: `cancelled` and `transfers` are guarded by `condition`.
    private let condition = NSCondition()
    private var cancelled = false
    /// The curl multi handles waiting now, woken by `cancel()`.
    private var transfers: [UnsafeMutableRawPointer] = []

    public init() {}

    public var isCancelled: Bool { condition.withLock { cancelled } }

    public func cancel() {
        condition.withLock {
            cancelled = true
            condition.broadcast()
            for multi in transfers { curl_multi_wakeup(multi) }
        }
    }

    /// Runs `body` with `multi` woken by a cancel; throws `.cancelled` (and `body` is not run)
    /// if already cancelled.
    public func whileWaiting<T>(on multi: UnsafeMutableRawPointer, _ body: () throws -> T) throws -> T {
        try condition.withLock {
            if cancelled { throw ReplicationError.cancelled }
            transfers.append(multi)
        }
        defer { condition.withLock { transfers.removeAll { $0 == multi } } }
        return try body()
    }

    /// Waits `seconds` unless cancelled first; throws `.cancelled` if so.
    public func sleep(_ seconds: Double) throws {
        let deadline = Date(timeIntervalSinceNow: seconds)
        try condition.withLock {
            while !cancelled && condition.wait(until: deadline) {}
            if cancelled { throw ReplicationError.cancelled }
        }
    }
}

/// A blocking HTTP/1.1 client on libcurl: keep-alive on one handle, TLS with the
/// system CAs (or `caFile`), verification on, bounded connect and stall times.
///
/// Transfers run on a multi handle of the client's own (it keeps the connections between
/// requests), waiting in `curl_multi_poll` for the socket or curl's next timer, so a request
/// waiting for its answer wakes nothing (`curl_easy_perform` would look once a second); a
/// cancel wakes the wait at once (`curl_multi_wakeup`).
public final class HTTPClient {
    private let handle: UnsafeMutableRawPointer
    private let multi: UnsafeMutableRawPointer
    public let remote: RemoteDatabase
    public var caFile: String?
    /// A request that makes no progress for this long fails (and is retried by the caller):
    /// its retry policy's.
    public var stallTimeout: Int {
        get { retry.stallTimeout }
        set { retry.stallTimeout = newValue }
    }
    public var connectTimeout = HTTPTuning.connectTimeout
    /// Bytes curl hands over per callback (its default is 16 KiB); bodies streamed into files
    /// take bigger pieces, for fewer calls and wake-ups per byte.
    public var receiveBufferSize: Int?
    public var retry = RetryPolicy()
    /// Called before each retry with what failed.
    public var onRetry: ((ReplicationError, Int) -> Void)?
    /// Stops requests in flight and retries with `.cancelled`.
    public var cancellation: Cancellation?
    /// `AuthSession` cookie after `_session` login; basic auth otherwise.
    var cookie: String?

    private static let globalInit: Void = { curl_global_init(Int(CURL_GLOBAL_DEFAULT)) }()

    public init(remote: RemoteDatabase) throws {
        _ = HTTPClient.globalInit
        guard let handle = curl_easy_init() else { throw ReplicationError.network("curl_easy_init failed") }
        guard let multi = curl_multi_init() else {
            curl_easy_cleanup(handle)
            throw ReplicationError.network("curl_multi_init failed")
        }
        self.handle = handle
        self.multi = multi
        self.remote = remote
    }

    /// A client of the same remote with the same settings and login, for another thread
    /// (each client is one thread's at a time). Its `cancellation` is its own.
    public func sibling() throws -> HTTPClient {
        let other = try HTTPClient(remote: remote)
        other.caFile = caFile
        other.connectTimeout = connectTimeout
        other.receiveBufferSize = receiveBufferSize
        other.retry = retry
        other.onRetry = onRetry
        other.cookie = cookie
        return other
    }

    deinit {
        curl_multi_cleanup(multi)
        curl_easy_cleanup(handle)
    }

    /// Context shared with curl's C callbacks.
    private final class Transfer {
        var body: [UInt8] = []
        var headers: [String: String] = [:]
        var status = 0
        /// Returns false to keep the bytes as the body (an error answer) instead.
        var sink: ((UnsafeRawBufferPointer, Int, [String: String]) throws -> Bool)?
        var upload: UploadSource?
        var error: (any Error)?
        var cancellation: Cancellation?
    }

    /// Sends a request. With `sink`, body bytes go there (with the status and headers) instead
    /// of being kept, unless the sink returns false for them (an error answer's body).
    /// `quietFor`: an answer that may legitimately send nothing for that long (a longpoll): no
    /// stall check (which wakes once a second), a whole-request limit of that plus the stall time.
    public func send(_ method: String, _ url: String, headers: [String: String] = [:], body: UploadSource? = nil,
              quietFor: Int? = nil,
              sink: ((UnsafeRawBufferPointer, Int, [String: String]) throws -> Bool)? = nil) throws -> HTTPAnswer {
        curl_easy_reset(handle)
        let transfer = Transfer()
        transfer.sink = sink
        transfer.upload = body
        transfer.cancellation = cancellation
        if cancellation?.isCancelled == true { throw ReplicationError.cancelled }
        let context = Unmanaged.passUnretained(transfer).toOpaque()
        ccurl_setopt_string(handle, CURLOPT_URL, url)
        ccurl_setopt_long(handle, CURLOPT_NOSIGNAL, 1)
        ccurl_setopt_long(handle, CURLOPT_CONNECTTIMEOUT, connectTimeout)
        if let quietFor {
            ccurl_setopt_long(handle, CURLOPT_TIMEOUT, quietFor + stallTimeout)
        } else {
            ccurl_setopt_long(handle, CURLOPT_LOW_SPEED_LIMIT, 1)
            ccurl_setopt_long(handle, CURLOPT_LOW_SPEED_TIME, stallTimeout)
        }
        ccurl_setopt_long(handle, CURLOPT_TCP_KEEPALIVE, 1)
        if let receiveBufferSize { ccurl_setopt_long(handle, CURLOPT_BUFFERSIZE, receiveBufferSize) }
        ccurl_setopt_long(handle, CURLOPT_SSL_VERIFYPEER, 1)
        ccurl_setopt_long(handle, CURLOPT_SSL_VERIFYHOST, 2)
        if let caFile { ccurl_setopt_string(handle, CURLOPT_CAINFO, caFile) }
        ccurl_setopt_string(handle, CURLOPT_USERAGENT, "Sofa-Replicator/0.1")
        if let cookie {
            ccurl_setopt_string(handle, CURLOPT_COOKIE, cookie)
        } else if let user = remote.user {
            ccurl_setopt_long(handle, CURLOPT_HTTPAUTH, 1)  // CURLAUTH_BASIC (a macro Swift cannot see)
            ccurl_setopt_string(handle, CURLOPT_USERNAME, user)
            ccurl_setopt_string(handle, CURLOPT_PASSWORD, remote.password ?? "")
        }
        ccurl_setopt_callback(handle, CURLOPT_WRITEFUNCTION) { buffer, size, count, context in
            let transfer = Unmanaged<Transfer>.fromOpaque(context!).takeUnretainedValue()
            let bytes = UnsafeRawBufferPointer(start: buffer, count: size * count)
            do {
                if try transfer.sink?(bytes, transfer.status, transfer.headers) != true { transfer.body.append(contentsOf: bytes) }
                return size * count
            } catch {
                transfer.error = error
                return 0  // aborts the transfer
            }
        }
        ccurl_setopt_pointer(handle, CURLOPT_WRITEDATA, context)
        ccurl_setopt_callback(handle, CURLOPT_HEADERFUNCTION) { buffer, size, count, context in
            let transfer = Unmanaged<Transfer>.fromOpaque(context!).takeUnretainedValue()
            let line = String(decoding: UnsafeRawBufferPointer(start: buffer, count: size * count), as: UTF8.self)
                .trimmingCharacters(in: .whitespacesAndNewlines)
            if line.hasPrefix("HTTP/") {
                // A new response (after a redirect or 100 Continue): start over.
                transfer.status = Int(line.split(separator: " ").dropFirst().first ?? "") ?? 0
                transfer.headers = [:]
            } else if let colon = line.firstIndex(of: ":") {
                transfer.headers[line[..<colon].lowercased()] = line[line.index(after: colon)...].trimmingCharacters(in: .whitespaces)
            }
            return size * count
        }
        ccurl_setopt_pointer(handle, CURLOPT_HEADERDATA, context)

        var list: UnsafeMutablePointer<curl_slist>?
        var allHeaders = headers
        allHeaders["Accept"] = allHeaders["Accept"] ?? "application/json"
        allHeaders["Expect"] = ""  // no 100-continue round trip
        for (name, value) in allHeaders { list = curl_slist_append(list, "\(name): \(value)") }
        defer { curl_slist_free_all(list) }
        ccurl_setopt_pointer(handle, CURLOPT_HTTPHEADER, UnsafeMutableRawPointer(list))

        switch method {
        case "GET": ccurl_setopt_long(handle, CURLOPT_HTTPGET, 1)
        case "HEAD": ccurl_setopt_long(handle, CURLOPT_NOBODY, 1)
        default:
            ccurl_setopt_string(handle, CURLOPT_CUSTOMREQUEST, method)
            if body != nil || method == "PUT" || method == "POST" {
                ccurl_setopt_long(handle, CURLOPT_UPLOAD, 1)
                ccurl_setopt_off(handle, CURLOPT_INFILESIZE_LARGE, curl_off_t(body?.length ?? 0))
                ccurl_setopt_callback(handle, CURLOPT_READFUNCTION) { buffer, size, count, context in
                    let transfer = Unmanaged<Transfer>.fromOpaque(context!).takeUnretainedValue()
                    guard let upload = transfer.upload else { return 0 }
                    do {
                        return try upload.read(into: UnsafeMutableRawBufferPointer(start: buffer, count: size * count))
                    } catch {
                        transfer.error = error
                        return Int(CURL_READFUNC_ABORT)
                    }
                }
                ccurl_setopt_pointer(handle, CURLOPT_READDATA, context)
            }
        }
        let code = try cancellation.map { cancellation in
            try cancellation.whileWaiting(on: multi) { perform(cancellation: cancellation) }
        } ?? perform(cancellation: nil)
        if code == CURLE_ABORTED_BY_CALLBACK || cancellation?.isCancelled == true { throw ReplicationError.cancelled }
        if let error = transfer.error { throw error }
        guard code == CURLE_OK else {
            // curl says only "Timeout was reached": which limit, and how to change it.
            let reason = code == CURLE_OPERATION_TIMEDOUT
                ? (quietFor == nil ? "nothing received for \(stallTimeout) s (--stall-timeout)"
                                   : "no answer within \(quietFor! + stallTimeout) s (--stall-timeout \(stallTimeout) s after the wait asked for)")
                : String(cString: curl_easy_strerror(code))
            throw ReplicationError.network("\(reason) (\(method) \(RemoteDatabase.redacted(url)))")
        }
        return HTTPAnswer(status: ccurl_response_code(handle), headers: transfer.headers, body: transfer.body)
    }

    /// Runs the transfer set up on `handle` to its end, or until `cancellation`.
    private func perform(cancellation: Cancellation?) -> CURLcode {
        curl_multi_add_handle(multi, handle)
        defer { curl_multi_remove_handle(multi, handle) }
        var running: Int32 = 1
        while true {
            guard curl_multi_perform(multi, &running) == CURLM_OK else { return CURLE_FAILED_INIT }
            if running == 0 { break }
            if cancellation?.isCancelled == true { return CURLE_ABORTED_BY_CALLBACK }
            // Until the socket is ready, curl's next timer is due, or a cancel wakes it.
            guard curl_multi_poll(multi, nil, 0, 3_600_000, nil) == CURLM_OK else { return CURLE_FAILED_INIT }
        }
        var left: Int32 = 0
        while let message = curl_multi_info_read(multi, &left) {
            if message.pointee.msg == CURLMSG_DONE { return message.pointee.data.result }
        }
        return CURLE_FAILED_INIT
    }

    /// Runs `operation` (which must be safe to repeat) until it succeeds, fails for good,
    /// or runs out of attempts.
    public func withRetry<T>(_ operation: () throws -> T) throws -> T {
        var delay = retry.initialDelay
        var loggedInAgain = false
        for attempt in 1... {
            do {
                return try operation()
            } catch ReplicationError.http(401, _, _, _) where cookie != nil && !loggedInAgain {
                // A session ends on the server's clock (CouchDB's after 10 minutes): a longer
                // replication logs in again, once per request, and asks again.
                loggedInAgain = true
                cookie = nil
                try logInOnce()
            } catch let error as ReplicationError where error.isTransient && attempt < retry.attempts {
                onRetry?(error, attempt)
                if let cancellation { try cancellation.sleep(delay) } else { Thread.sleep(forTimeInterval: delay) }
                delay = min(delay * 2, retry.maximumDelay)
            }
        }
        preconditionFailure("unreachable")
    }

    /// A JSON request, retried while failures are transient; throws `.http` for error statuses.
    public func json(_ method: String, _ path: String, _ body: JSONValue? = nil, allow: Set<Int> = [],
              quietFor: Int? = nil) throws -> (status: Int, json: JSONValue) {
        try withRetry { try jsonOnce(method, path, body, allow: allow, quietFor: quietFor) }
    }

    private func jsonOnce(_ method: String, _ path: String, _ body: JSONValue? = nil, allow: Set<Int> = [],
                          quietFor: Int? = nil) throws -> (status: Int, json: JSONValue) {
        let url = remote.url(path)
        var headers: [String: String] = [:]
        var upload: UploadSource?
        if let body {
            headers["Content-Type"] = "application/json"
            upload = BytesUpload(body.serialized())
        }
        let answer = try send(method, url, headers: headers, body: upload, quietFor: quietFor)
        if answer.status >= 400 && !allow.contains(answer.status) { throw httpError(answer, url: url) }
        guard let json = answer.json else {
            throw ReplicationError.protocolError("\(method) \(RemoteDatabase.redacted(url)) answered \(answer.status) without JSON")
        }
        return (answer.status, json)
    }

    public func httpError(_ answer: HTTPAnswer, url: String) -> ReplicationError {
        let json = answer.json
        return .http(status: answer.status, error: json?["error"]?.stringValue ?? "error",
                     reason: json?["reason"]?.stringValue ?? String(decoding: answer.body.prefix(200), as: UTF8.self),
                     url: RemoteDatabase.redacted(url))
    }

    /// Logs in with `POST /_session` when credentials are known, so later requests carry
    /// a cookie rather than the password. Servers without sessions keep basic auth. A reset
    /// or an empty reply is retried as any other request is.
    public func logIn() throws {
        try withRetry { try logInOnce() }
    }

    private func logInOnce() throws {
        guard let user = remote.user, cookie == nil else { return }
        guard let root = URLComponents(string: remote.url).map({ components -> String in
            var components = components
            components.path = "/_session"
            return components.string!
        }) else { return }
        let form = "name=\(user.addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? user)&password=\((remote.password ?? "").addingPercentEncoding(withAllowedCharacters: .alphanumerics) ?? "")"
        let answer = try send("POST", root, headers: ["Content-Type": "application/x-www-form-urlencoded"], body: BytesUpload(Array(form.utf8)))
        if answer.status == 401 { throw httpError(answer, url: root) }
        if answer.status == 200, let setCookie = answer.headers["set-cookie"], setCookie.hasPrefix("AuthSession=") {
            cookie = String(setCookie.split(separator: ";")[0])
        }
    }
}
