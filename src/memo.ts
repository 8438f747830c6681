/** The value cached under `key`, built and cached on first use. */
export function memo<K, V>(cache: Map<K, V>, key: K, build: () => V): V {
  let value = cache.get(key);
  if (value === undefined) {
    value = build();
    cache.set(key, value);
  }
  return value;
}
