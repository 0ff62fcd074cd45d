// Stub: the CLI work replaces this.
int main() { return 0; }
