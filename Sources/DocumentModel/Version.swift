/// Sofa's release, shown by `sofa --version` and in `sofa serve`'s welcome (`vendor.version`).
public enum SofaVersion {
    public static let current = "0.5.0"
}
