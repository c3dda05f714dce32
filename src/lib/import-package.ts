/**
 * Loads, on first use, a package the bundle leaves in node_modules
 * (scripts/build.js: EXTERNAL). Every such import goes through here because
 * the service's bundle runs as a vm.Script (src/launcher/code-cache.ts), and
 * there an `import()` has no loader: Node 20 loses it for code read back from
 * V8's cache, and Node 22 offers one only as an experimental feature. The
 * launcher hands in the `import()` of its own ES module instead.
 */
let importer = async (specifier: string): Promise<unknown> => await import(specifier)

export async function importPackage<T> (specifier: string): Promise<T> {
  return await importer(specifier) as T
}

export function setPackageImporter (importFromLauncher: (specifier: string) => Promise<unknown>): void {
  importer = importFromLauncher
}
