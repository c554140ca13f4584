import DocumentModel
import Logging

/// Standard error's log handler with every line one line: control characters in a message or
/// a metadata value (a file or document name with a newline, an escape sequence) are written
/// escaped (`\n`, `\u{1B}`), so a name cannot forge a log line or drive the terminal.
struct OneLineLogHandler: LogHandler {
    private var inner: StreamLogHandler

    init(label: String, level: Logger.Level) {
        inner = StreamLogHandler.standardError(label: label)
        inner.logLevel = level
    }

    var logLevel: Logger.Level {
        get { inner.logLevel }
        set { inner.logLevel = newValue }
    }

    var metadata: Logger.Metadata {
        get { inner.metadata }
        set { inner.metadata = newValue }
    }

    var metadataProvider: Logger.MetadataProvider? {
        get { inner.metadataProvider }
        set { inner.metadataProvider = newValue }
    }

    subscript(metadataKey key: String) -> Logger.Metadata.Value? {
        get { inner[metadataKey: key] }
        set { inner[metadataKey: key] = newValue }
    }

    func log(event: LogEvent) {
        var event = event
        event.message = "\(event.message.description.escapingControlCharacters)"
        event.metadata = event.metadata?.mapValues(OneLineLogHandler.escaped)
        inner.log(event: event)
    }

    static func escaped(_ value: Logger.Metadata.Value) -> Logger.Metadata.Value {
        switch value {
        case .string(let text): .string(text.escapingControlCharacters)
        case .stringConvertible(let value): .string(value.description.escapingControlCharacters)
        case .array(let values): .array(values.map(escaped))
        case .dictionary(let values): .dictionary(values.mapValues(escaped))
        }
    }
}
